"""The process minter when its lease renewal cannot reach the database (issue 11, D4/I1)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from canonical_ids.exceptions import NoWriterSlot
from canonical_ids.models import WriterSlotLease

pytestmark = pytest.mark.django_db(transaction=True)


def _hold_row_lock(slot: int, locked: threading.Event, release: threading.Event) -> None:
    """Another session holds the lease row locked until `release` (60 s at most), so a
    renewal waits (then times out). Held until told, not for a fixed time: on a loaded
    machine the renewal may start its 5 s lock wait late, and a lock let go first would
    let it succeed."""
    conn = connections.create_connection("default")
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT slot FROM canonical_ids_writerslotlease WHERE slot = %s FOR UPDATE", [slot]
            )
            locked.set()
            release.wait(60)
            cursor.execute("ROLLBACK")
    finally:
        conn.close()


def test_i1_a_renewal_that_fails_after_the_lease_expired_stops_minting(settings, minters):
    """A renewal that cannot confirm the lease before it expires must stop minting: the
    slot may belong to another process by then. The minter judged "still valid" by the
    clock read *before* the renewal, so a renewal that hung past the expiry and then failed
    let it go on minting in a slot it no longer held (I1)."""
    settings.CANONICAL_IDS_WORKER_POOL = "64"
    settings.CANONICAL_IDS_LEASE_TTL = 2.0
    settings.CANONICAL_IDS_RENEW_INTERVAL = 1.0
    holder = minters(renew_on_timer=False)  # this is about the renewal a mint makes
    holder.mint()
    time.sleep(1.1)  # renewal due on the next mint, the lease still valid for ~0.9 s
    locked, release = threading.Event(), threading.Event()
    blocker = threading.Thread(target=_hold_row_lock, args=(64, locked, release))
    blocker.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with pytest.raises(NoWriterSlot, match="refusing to mint"):
            holder.mint()  # the renewal waits for the lock (5 s lock_timeout), then fails
        assert time.monotonic() - started > 2.0  # it did wait past the expiry
    finally:
        release.set()
        blocker.join(timeout=30)
    assert holder.slot is None

    # Once the database answers again the minter claims a slot anew and mints.
    assert holder.mint()
    assert WriterSlotLease.objects.get(slot=64).holder_token == holder.token


def test_renewal_reconnects_after_the_backends_were_terminated(settings, minters):
    """Every lease statement opens its own connection: terminating every backend (as a
    server restart does) costs the renewal nothing."""
    settings.CANONICAL_IDS_WORKER_POOL = "65"
    settings.CANONICAL_IDS_LEASE_TTL = 2.0
    settings.CANONICAL_IDS_RENEW_INTERVAL = 0.5
    holder = minters()
    first = holder.mint()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    finally:
        other.close()
    connection.close()  # this test's own connection was among them
    time.sleep(0.6)
    assert holder.mint() > first
    assert holder.slot == 65
    row = WriterSlotLease.objects.get(slot=65)
    assert row.holder_token == holder.token and row.last_ts == first
