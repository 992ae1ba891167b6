"""Opt-in pytest plugin: name every test that leaves rows behind in the test database.

    scripts/test tests/jobs -p tests.support.leak_probe

A test in a rolled-back transaction (`django_db` without transaction=True) whose rows were
committed anyway (a thread's own connection, another session, a child process), or a
transaction=True test whose processes write after its flush, leaves rows that a later test
counting a whole table sees (issue 36: 2,005 completed jobs instead of 5). After each test,
once its fixtures are torn down, this plugin counts every table's rows on a connection of its
own and appends a line naming the tables that grew since the test began to
var/leak_probe.txt (LEAK_PROBE_FILE overrides).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

OUT = Path(
    os.environ.get(
        "LEAK_PROBE_FILE", Path(__file__).resolve().parents[2] / "var" / "leak_probe.txt"
    )
)

_conn = None


def _counts() -> dict[str, int] | None:
    """{table: rows} of the test database, or None before pytest-django has made it."""
    global _conn
    from django.db import connection

    name = connection.settings_dict["NAME"]
    if not name.startswith("test_"):
        return None
    if _conn is None or _conn.closed:
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        params.pop("prepare_threshold", None)
        _conn = psycopg.connect(**params, autocommit=True)
    tables = [
        row[0]
        for row in _conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
        )
    ]
    if not tables:
        return {}
    union = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in tables)
    return dict(_conn.execute(union).fetchall())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _counts()
    yield
    after = _counts()
    if before is None or after is None:
        return
    grew = {t: after[t] - before.get(t, 0) for t in after if after[t] > before.get(t, 0)}
    if grew:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        with OUT.open("a") as out:
            out.write(f"{item.nodeid} left rows behind: {grew}\n")
