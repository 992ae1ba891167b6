"""Minting under faults at its round trips, while the lease is renewed (issue 30; I1, I2,
I22)."""

from __future__ import annotations

import pytest

from tests.faults.minting_scenario import MINTING
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _renewal(trip) -> bool:
    return "UPDATE canonical_ids_writerslotlease SET renewed_at" in trip.statement


@pytest.mark.django_db(transaction=True)
def test_minting_stays_unique_and_in_its_slot_under_a_fault_of_each_kind(harness):
    """The slot claim commits and its answer is lost: the minter claims again, never mints
    outside a slot it holds. A renewal that never reaches the server: still valid, retried.
    Killed right after a renewal: the next process mints unique ids."""
    outcomes = harness.cases(
        MINTING,
        [
            (LOST_ANSWER, lambda trip: trip.statement == "COMMIT", 0),
            (ERROR_BEFORE, _renewal, 0),
            (KILL_AFTER, _renewal, 0),
        ],
    )
    report("minting-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_minting_under_every_fault(harness):
    outcomes = harness.enumerate(MINTING)
    report("minting-all", outcomes)
    assert_held(outcomes, all_fired=False)
