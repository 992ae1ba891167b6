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
from django.contrib.auth import get_user_model
from model_bakery import baker

from canonical_ids.leases import Holder, lease_acquire, lease_release, lease_renew
from notifications.models import Proposal
from notifications.sweeps import sweep_new_proposals
from processes.services import process_beat, process_register, process_stop
from project.db_clock import db_now
from tests.support import processes
from tests.support.held_sender import HeldSender, SweepInThread
from tests.support.pgbouncer import django_through_pgbouncer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pooled() -> Iterator[str]:
    """The pooled URL; Django's default connection goes through it too."""
    with django_through_pgbouncer(pool_size=1) as url:
        yield url


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

    assert _session_settings(pooled) == expected


def test_through_pgbouncer_a_sweep_running_elsewhere_is_still_not_run_twice(pooled):
    """The sweeps' session advisory lock, through transaction pooling: the server connection
    that took it serves the next client too, for whom `pg_try_advisory_lock` succeeds again
    (the same session holds it), so two cycles of one sweep ran at once."""
    first = _pi(1)
    other = SweepInThread("new_proposal", HeldSender())
    other.start()
    assert other.sender.sending.wait(timeout=30)

    summary = sweep_new_proposals(sender=HeldSender())
    assert summary.busy and summary.sent == 0

    assert other.finish().sent == 1
    assert other.sender.recipients == [first.email]
    second = _pi(2)
    released = HeldSender()
    released.release.set()
    assert sweep_new_proposals(sender=released).sent == 1  # the lease was given back
    assert released.recipients == [second.email]


def _pi(n: int):
    user = baker.make(get_user_model(), username=f"pi{n}", email=f"pi{n}@example.org")
    baker.make(Proposal, pi=user, title=f"Proposal {n}", status=Proposal.Status.IN_REVIEW)
    return user


def test_a_queryset_iterated_in_chunks_holds_no_cursor_across_transactions():
    """`QuerySet.iterator()` (the admin's choice fields use it) declares a server-side
    cursor `WITH HOLD` in autocommit and fetches from it in later statements. Through
    transaction pooling a later FETCH may land on another server connection, where the
    cursor does not exist: DISABLE_SERVER_SIDE_CURSORS keeps every read in one statement."""
    for n in range(5):
        _pi(n)
    with django_through_pgbouncer(pool_size=2) as url:
        rows = get_user_model().objects.order_by("pk").values_list("username", flat=True)
        chunks = rows.iterator(chunk_size=2)
        first = next(chunks)
        with psycopg.connect(url) as other:  # a transaction holding the cursor's connection
            other.execute("SELECT 1")
            rest = list(chunks)
    assert [first, *rest] == [f"pi{n}" for n in range(5)]
