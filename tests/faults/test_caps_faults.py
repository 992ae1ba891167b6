"""A worker's start (the caps per kind written from code) and a drain of a capped kind under
faults at their round trips (issue 37, point 2; I22)."""

from __future__ import annotations

import pytest

from tests.faults.caps_scenario import CAPS_START
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _cap_sync(trip) -> bool:
    return "INSERT INTO jobs_kindcap" in trip.statement


@pytest.mark.django_db(transaction=True)
def test_the_start_up_cap_sync_under_a_fault_of_each_kind(harness):
    """The sync never reaches the server: the start fails, the next start writes the caps.
    Its answer is lost after it committed, or the process is killed right after it: the next
    start finds nothing to change. Every capped job runs once either way."""
    outcomes = harness.cases(
        CAPS_START,
        [(ERROR_BEFORE, _cap_sync, 0), (LOST_ANSWER, _cap_sync, 0), (KILL_AFTER, _cap_sync, 0)],
    )
    report("caps-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_start_with_caps_under_every_fault(harness):
    outcomes = harness.enumerate(CAPS_START)
    report("caps-all", outcomes)
    assert_held(outcomes, all_fired=False)
