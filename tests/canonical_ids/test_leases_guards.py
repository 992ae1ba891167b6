"""The writer-slot lease's guards, each caught by a test if it is removed (issue 14).

A pool claim takes the lowest free slot with `UPDATE .. WHERE slot = (SELECT .. FOR UPDATE
SKIP LOCKED)`: a slot another process is claiming right now is skipped, never waited for
and never taken twice (two live holders of one slot would mint colliding ids, V11). Renewal
and release match the holder's token, so a process that lost its lease changes nothing of
the next holder's. docs/architecture.md lists the mutants these were seen failing on.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from canonical_ids import leases
from canonical_ids.minter import parse_ts
from canonical_ids.models import Message, WriterSlotLease
from tests.support.locks import LockWait, LockWaitWatcher, OpenTransaction
from tests.support.processes import child_env, spawn_manage_py

pytestmark = pytest.mark.django_db(transaction=True)

POOL = [70, 71, 72, 73, 74, 75]
MINTERS = 3


def _holder() -> leases.Holder:
    return leases.Holder.current("worker", timezone.now())


def _free_pool() -> None:
    """The pool's rows exist and are free (a holder came and went)."""
    lease = leases.lease_acquire(slots=POOL, holder=_holder(), ttl=60)
    assert leases.lease_release(slot=lease.slot, token=lease.token, last_ts="")


def _claim_in_flight(slot: int) -> OpenTransaction:
    """Another process's pool claim that has locked `slot` (its sub-select) and not yet
    written it."""
    return OpenTransaction(
        lambda: list(
            WriterSlotLease.objects.select_for_update()
            .filter(slot=slot)
            .values_list("slot", flat=True)
        )
    )


def _is_ensure_rows(wait: LockWait) -> bool:
    """`INSERT .. ON CONFLICT DO NOTHING` of the pool's rows waits for another process's
    one-statement claim of an existing row to commit: a wait of one autocommit statement,
    not the claim's (see the report of issue 14)."""
    return wait.query.lstrip().upper().startswith("INSERT INTO")


def test_a_slot_being_claimed_is_skipped_without_waiting():
    """The lowest free slot is locked by a claim in flight: the acquire takes the next one
    at once. Without SKIP LOCKED it waits for the other claim (and then takes its slot);
    with no row lock its UPDATE waits, then takes the slot the other claim is writing."""
    _free_pool()
    claim = _claim_in_flight(POOL[0])
    with claim, LockWaitWatcher(on_first_wait=claim.release, ignore=_is_ensure_rows) as watcher:
        assert claim.result == [POOL[0]]
        lease = leases.lease_acquire(slots=POOL, holder=_holder(), ttl=60)

    assert watcher.waits == [], "the acquire waited on a row lock:\n" + watcher.report()
    assert lease.slot == POOL[1]


@pytest.mark.slow
def test_processes_claiming_at_once_get_distinct_slots_and_skip_one_being_claimed():
    """Three `mint_messages` processes claim slots from one pool at the same time (they
    start together at a wall-clock instant) while another claim of the lowest slot is in
    flight: each gets its own slot, none the held one, no claim waits on a lock, and their
    ids never collide."""
    _free_pool()
    env = child_env(CANONICAL_IDS_ROLE="worker", CANONICAL_IDS_WORKER_POOL="70-75")
    claim = _claim_in_flight(POOL[0])
    watch = LockWaitWatcher(on_first_wait=claim.release, ignore=_is_ensure_rows)
    with claim, watch as watcher:
        start_at = timezone.now().timestamp() + 8  # after every process has started
        args = ["mint_messages", "--run-id", "guards", "--count", "50", "--start-at"]
        minters = [spawn_manage_py(*args, str(start_at), env=env) for _ in range(MINTERS)]
        try:
            outputs = [minter.communicate(timeout=120) for minter in minters]
        finally:
            for minter in minters:
                if minter.poll() is None:
                    minter.kill()
                    minter.wait(timeout=10)
    assert [minter.returncode for minter in minters] == [0] * MINTERS, outputs

    assert watcher.waits == [], "a claim waited on a row lock:\n" + watcher.report()
    slots = [json.loads(out.strip().splitlines()[-1])["slot"] for out, _err in outputs]
    assert len(set(slots)) == MINTERS and POOL[0] not in slots, slots
    ids = list(Message.objects.filter(run_id="guards").values_list("ts", flat=True))
    assert len(ids) == len(set(ids)) == 50 * MINTERS
    assert {parse_ts(ts) % 100 for ts in ids} == set(slots)


def test_a_holder_that_lost_its_lease_cannot_release_the_next_holders_slot():
    """A holder stalled past its TTL; another process took the slot. The stalled holder's
    release (at exit) must leave the new lease alone, or a third process could claim the
    slot while the new holder still mints in it."""
    stalled = leases.lease_acquire(slots=[POOL[0]], holder=_holder(), ttl=60)
    WriterSlotLease.objects.filter(slot=POOL[0]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    current = leases.lease_acquire(slots=[POOL[0]], holder=_holder(), ttl=60)
    assert current.slot == stalled.slot

    assert not leases.lease_release(slot=stalled.slot, token=stalled.token, last_ts="")

    row = WriterSlotLease.objects.get(slot=POOL[0])
    assert row.holder_token == current.token and row.expires_at > timezone.now()
    assert leases.lease_is_held(slot=current.slot, token=current.token)
