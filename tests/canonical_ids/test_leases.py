"""Writer-slot leases: one live holder per slot, renewal, hand-over above the last id."""

from __future__ import annotations

import pytest

from canonical_ids import leases
from canonical_ids.exceptions import SlotUnavailable
from canonical_ids.minter import parse_ts
from canonical_ids.models import WriterSlotLease

pytestmark = pytest.mark.django_db(transaction=True)


def test_four_leased_minters_get_distinct_slots_and_never_collide(minters):
    """V11, acceptance 2 through the real leases: 4 holders x 200 ids, zero collisions."""
    holders = [minters() for _ in range(4)]
    ids = [h.mint() for _ in range(200) for h in holders]
    slots = {h.slot for h in holders}
    assert len(slots) == 4 and not slots & {1, 2, 3}
    assert len(ids) == len(set(ids)) == 800
    assert {parse_ts(t) % 100 for t in ids} == slots
    rows = WriterSlotLease.objects.filter(slot__in=slots)
    assert {(r.role, r.holder_token) for r in rows} == {("worker", h.token) for h in holders}


def test_lease_row_names_the_holder(minters):
    import os
    import socket

    holder = minters()
    holder.mint()
    row = WriterSlotLease.objects.get(slot=holder.slot)
    assert (row.holder_host, row.holder_pid, row.role) == (
        socket.gethostname(),
        os.getpid(),
        "worker",
    )
    assert row.acquired_at and row.renewed_at and row.holder_started_at
    assert row.expires_at > row.renewed_at


def test_a_fixed_role_slot_has_one_live_holder(settings, minters):
    """I1: two processes configured as "web" cannot both mint in slot 1: the second one raises."""
    settings.CANONICAL_IDS_ROLE = "web"
    first = minters()
    assert parse_ts(first.mint()) % 100 == 1
    with pytest.raises(SlotUnavailable, match="No writer slot free for role 'web'"):
        minters().mint()


def test_an_exhausted_pool_raises(settings, minters):
    """I1: with every slot of the pool held, one more minter raises; it never shares a slot."""
    settings.CANONICAL_IDS_WORKER_POOL = "70-71"
    minters().mint()
    minters().mint()
    with pytest.raises(SlotUnavailable):
        minters().mint()


def test_renewal_stores_the_last_id_and_a_new_holder_starts_above_it(settings, minters, clock):
    """A holder whose clock ran ahead hands its slot over; the next holder starts above."""
    settings.CANONICAL_IDS_WORKER_POOL = "61"
    clock.now += 3600  # this holder's clock is an hour ahead
    ahead = minters(time_source=clock.time, sleep=clock.sleep, monotonic=clock.monotonic)
    issued = [ahead.mint() for _ in range(3)]
    clock.mono += settings.CANONICAL_IDS_RENEW_INTERVAL  # renewal due on the next mint
    issued.append(ahead.mint())
    row = WriterSlotLease.objects.get(slot=61)
    assert row.last_ts == issued[-2]  # stored at renewal, before the 4th id
    ahead.release()
    row.refresh_from_db()
    assert row.last_ts == issued[-1] and row.expires_at is None

    successor = minters()  # real clock, an hour behind
    first = successor.mint()
    assert successor.slot == 61
    assert first > issued[-1]


def test_a_lost_lease_is_not_renewed_and_ids_keep_increasing(settings, minters, clock):
    """A holder whose expired lease was taken over claims another slot on its next mint."""
    settings.CANONICAL_IDS_WORKER_POOL = "62-63"
    idle = minters(monotonic=clock.monotonic)
    before = idle.mint()
    assert idle.slot == 62
    WriterSlotLease.objects.filter(slot=62).update(expires_at=None)  # as if it had expired
    thief = minters()
    thief.mint()
    assert thief.slot == 62
    clock.mono += settings.CANONICAL_IDS_RENEW_INTERVAL
    after = idle.mint()
    assert idle.slot == 63
    assert after > before
    assert WriterSlotLease.objects.get(slot=62).holder_token == thief.token


def test_lease_acquire_skips_live_leases_and_takes_expired_ones(settings):
    import datetime

    from django.utils import timezone

    holder = leases.Holder.current("worker", timezone.now())
    live = leases.lease_acquire(slots=[80, 81], holder=holder, ttl=60)
    assert live.slot == 80
    WriterSlotLease.objects.filter(slot=80).update(
        expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    assert leases.lease_acquire(slots=[80, 81], holder=holder, ttl=60).slot == 80
    assert leases.lease_acquire(slots=[80, 81], holder=holder, ttl=60).slot == 81
    with pytest.raises(SlotUnavailable):
        leases.lease_acquire(slots=[80, 81], holder=holder, ttl=60)
    assert not leases.lease_renew(slot=80, token=live.token, last_ts="", ttl=60)


def test_the_lease_connection_has_a_statement_timeout():
    """Issue 19.10: no lease statement can hang its caller (nor hold a row lock) for long."""
    from canonical_ids.leases import lease_connection

    with lease_connection() as conn, conn.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "10s"
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "5s"
