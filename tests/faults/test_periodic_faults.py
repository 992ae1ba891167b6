"""A periodic tick's round trips under faults (issue 38, point 4; I22): the tick's row and
its job in one transaction, the pruning of old ticks, the tick's job run. Named cases in
the default suite, every round trip under every fault with `-m fault_enumeration`."""

from __future__ import annotations

import pytest

from tests.faults.periodic_scenario import PERIODIC_START
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _tick_insert(trip) -> bool:
    return "INSERT INTO jobs_periodic_tick" in trip.statement


def _prune(trip) -> bool:
    return "DELETE FROM jobs_periodic_tick" in trip.statement


@pytest.mark.django_db(transaction=True)
def test_a_tick_and_its_pruning_under_a_fault_of_each_kind(harness):
    """The tick's insert never reaches the server (the next start fires it), the pruning's
    batch commits and loses its answer, the process dies right after the tick's insert
    (rolled back: the next start fires it) or after a pruning batch."""
    outcomes = harness.cases(
        PERIODIC_START,
        [
            (ERROR_BEFORE, _tick_insert, 0),
            (KILL_AFTER, _tick_insert, 0),
            (LOST_ANSWER, _prune, 0),
            (KILL_AFTER, _prune, 0),
        ],
    )
    report("periodic-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_periodic_tick_under_every_fault(harness):
    outcomes = harness.enumerate(PERIODIC_START)
    report("periodic-all", outcomes)
    assert_held(outcomes, all_fired=False)
