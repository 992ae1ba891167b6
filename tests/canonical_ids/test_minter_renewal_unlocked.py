"""The minter renews its lease without its mint lock (issue 37, the connection budget).

With the lock held across the renewal, every thread that minted meanwhile waited for it,
each inside its handler's transaction; behind PgBouncer those transactions held every server
connection and the renewal's own connection waited for one of them: the scale-out rehearsal
stalled with 10 slots per process. The lease is still valid while its renewal is in flight,
so the other threads go on minting under it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from tests.canonical_ids.test_minter_lease_loss import _hold_row_lock

pytestmark = pytest.mark.django_db(transaction=True)


def _renewal_waiting_for_the_row() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%%canonical_ids_writerslotlease%%'"
        )
        return cursor.fetchone()[0] > 0


def test_other_threads_mint_while_a_renewal_waits_for_the_database(settings, minters):
    settings.CANONICAL_IDS_WORKER_POOL = "65"
    settings.CANONICAL_IDS_LEASE_TTL = 30.0
    settings.CANONICAL_IDS_RENEW_INTERVAL = 1.0
    holder = minters(renew_on_timer=False)  # the renewal a mint makes
    first = holder.mint()
    time.sleep(1.1)  # the renewal is due at the next mint; the lease valid for ~29 s more
    locked, release = threading.Event(), threading.Event()
    blocker = threading.Thread(target=_hold_row_lock, args=(65, locked, release))
    blocker.start()
    minted: dict[str, str] = {}
    renewing = threading.Thread(target=lambda: minted.setdefault("renewing", holder.mint()))
    try:
        assert locked.wait(10)
        renewing.start()  # its renewal waits for the row lock (5 s lock_timeout)
        deadline = time.monotonic() + 10
        while not _renewal_waiting_for_the_row():
            assert time.monotonic() < deadline, "the renewal never waited for the row"
            time.sleep(0.02)

        other = threading.Thread(target=lambda: minted.setdefault("other", holder.mint()))
        other.start()
        other.join(4)  # well inside the renewal's 5 s lock wait
        assert "other" in minted, "a mint waited for the renewal in flight"
        assert renewing.is_alive() and _renewal_waiting_for_the_row()
    finally:
        release.set()
        blocker.join(timeout=30)
        renewing.join(timeout=30)
    assert minted["other"] > first and minted["renewing"] > first
    assert minted["other"] != minted["renewing"]
    assert holder.slot == 65  # renewed, still held
