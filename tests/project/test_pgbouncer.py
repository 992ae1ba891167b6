"""Behind PgBouncer in transaction pooling (issue 22.6): nothing relies on session state.

Each test points Django's default connection at a PgBouncer with one server connection per
pool, so every client's transactions share that server connection in turn: whatever a
statement leaves on its session (a `SET`, a held advisory lock, an open cursor) is seen by
the next client, or is gone when the same client's next transaction lands elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from canonical_ids.leases import Holder, lease_acquire, lease_release, lease_renew
from processes.services import process_beat, process_register, process_stop
from project.db_clock import db_now
from tests.support import processes
from tests.support.pgbouncer import PgBouncer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pooled() -> Iterator[PgBouncer]:
    """Django's default connection (and every connection copied from its settings) through a
    PgBouncer in transaction pooling with a single server connection."""
    direct = processes.test_database_url()
    with PgBouncer(direct, pool_size=1) as bouncer:
        saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port)
        bouncer.pooled_url = bouncer.url(direct)
        try:
            yield bouncer
        finally:
            connection.close()
            connection.settings_dict.update(saved)


def _session_settings(url: str) -> tuple[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        statement = conn.execute("SHOW statement_timeout").fetchone()[0]
        lock = conn.execute("SHOW lock_timeout").fetchone()[0]
    return statement, lock


def test_lease_and_process_beats_leave_no_session_setting_on_a_pooled_server_connection(pooled):
    """The writer-slot leases and the process registry bound their statements with
    `SET statement_timeout` / `SET lock_timeout` on their own connection. Through PgBouncer
    in transaction pooling that SET stays on the server connection when the client goes:
    the next client, a sweep or a migration, inherits a 5 s statement timeout."""
    expected = _session_settings(processes.test_database_url())

    holder = Holder.current("worker", db_now())
    lease = lease_acquire(slots=[50], holder=holder, ttl=60)
    assert lease_renew(slot=lease.slot, token=lease.token, last_ts="", ttl=60)
    lease_release(slot=lease.slot, token=lease.token, last_ts="")
    process_id = process_register(role="qcluster", interval=10)
    assert process_beat(process_id=process_id, current="")
    process_stop(process_id=process_id)

    assert _session_settings(pooled.pooled_url) == expected
