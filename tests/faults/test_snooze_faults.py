"""A snooze's round trips under faults (issue 38, point 2; I22): the named cases in the
default suite, every round trip under every fault with `-m fault_enumeration`."""

from __future__ import annotations

import pytest

from tests.faults.snooze_scenario import SNOOZE_DRAIN
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _snooze_record(trip) -> bool:
    return "snoozes >=" in trip.statement


def _commit(trip) -> bool:
    return trip.statement == "COMMIT"


@pytest.mark.django_db(transaction=True)
def test_a_snooze_record_under_a_fault_of_each_kind(harness):
    """The snooze's UPDATE never reaches the server (retried), commits and loses its answer
    (the retry finds the row no longer this claim's: nothing written twice), or its process
    is killed right after it (the snooze stands, the next drain completes the job)."""
    outcomes = harness.cases(
        SNOOZE_DRAIN,
        [
            (ERROR_BEFORE, _snooze_record, 0),
            (LOST_ANSWER, _commit, 0),  # the first commit: the first snooze's
            (KILL_AFTER, _snooze_record, 0),
            (KILL_AFTER, _snooze_record, 1),
        ],
    )
    report("snooze-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_snoozing_drain_under_every_fault(harness):
    outcomes = harness.enumerate(SNOOZE_DRAIN)
    report("snooze-all", outcomes)
    assert_held(outcomes, all_fired=False)
