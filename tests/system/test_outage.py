"""A quiet outage (invariant I24, issue 31 point 2): a qcluster with 4 workers loses its
database for 40 s. Each loop writes one line when it starts failing, then at most one per
30 s with a count of the repeats, no traceback for the expected connection error, and one
line when it works again. bench/outage.py measures the same over 5 minutes of a real
server stopped.

The database "goes down" through a proxy (tests/support/tcp_proxy.py, OutageProxy): every
connection reset and the port closed, then opened again; the server other tests share is
never stopped. The qcluster reaches the test database only through it.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support.outage_log import OutageLog
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until
from tests.support.tcp_proxy import OutageProxy

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOWN_SECONDS = 40


def _through(url: str, port: int) -> str:
    """The test database's URL with the proxy as its host and port."""
    scheme, rest = url.split("://", 1)
    auth, _, tail = rest.rpartition("@")
    name = tail.split("/", 1)[1]
    return f"{scheme}://{auth}@127.0.0.1:{port}/{name}"


def _recovered(record) -> bool:
    return record.recovery


def test_a_40_s_outage_is_a_few_lines_per_loop(subprocess_env, tmp_path):
    from django.db import connection

    port = int(connection.settings_dict.get("PORT") or 5432)
    host = connection.settings_dict.get("HOST") or "127.0.0.1"
    if host.startswith("/"):
        pytest.skip("the test database is on a Unix socket: no TCP proxy in front of it")
    log_path = tmp_path / "qcluster.log"
    with OutageProxy(host, port) as proxy:
        env = {
            **subprocess_env,
            "DATABASE_URL": _through(subprocess_env["DATABASE_URL"], proxy.port),
            "Q_WORKERS": "4",
            "LOG_LEVEL": "INFO",
            "LOG_FORMAT": "text",
            "DEBUG": "false",
            "CANONICAL_IDS_ROLE": "worker",
            "CANONICAL_IDS_LEASE_TTL": "60",
            "PROCESS_HEARTBEAT_SECONDS": "2",
        }
        with log_path.open("w") as out:
            cluster = spawn_manage_py(
                "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_until(
                lambda: log_path.read_text().count("holds writer slot") >= 4,
                "the 4 workers hold their writer slots",
                timeout=90,
            )
            time.sleep(3)  # the start-up's schedule run
            before = len(log_path.read_bytes())
            proxy.down()
            time.sleep(DOWN_SECONDS)  # the outage under test, not a wait for a result
            during = log_path.read_bytes()[before:].decode(errors="replace")
            proxy.up()

            def every_failing_loop_recovered() -> bool:
                outage = OutageLog(log_path.read_bytes()[before:].decode(errors="replace"))
                failing = {
                    r.loop
                    for r in outage.records
                    if r.level in {"WARNING", "ERROR"} and r.logger != "django-q"
                }
                back = {r.loop for r in outage.records if _recovered(r)}
                return bool(failing) and failing <= back

            wait_until(every_failing_loop_recovered, "every failing loop says it works again", 90)
        finally:
            stop_process_group(cluster)
    outage = OutageLog(during)
    after = OutageLog(log_path.read_bytes()[before:].decode(errors="replace"))
    report = after.table(minutes=DOWN_SECONDS / 60 + 1)
    assert outage.tracebacks == 0, report
    assert all(not line.startswith("Traceback") for line in after.lines), report
    # At most one line per loop per 30 s while down: the first, then a count.
    busiest = max(outage.most_in_a_window(29.9).values())  # ms stamps of a 30 s rule
    assert busiest <= 1, report
    assert max(outage.per_loop().values()) <= 2, report
    # Repeats are counted: a process beat is tried every 2 s here.
    counted = outage.matching("more in the last 30 s")
    assert sum("process beat" in r.message for r in counted) == 5, report
    # One line per loop when it works again.
    back = [r.loop for r in after.records if _recovered(r)]
    assert len(back) == len(set(back)), report
    assert sum("writer slot renewal" in loop for loop in back) == 4, report
