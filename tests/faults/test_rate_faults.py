"""A worker's start (the rates per kind written from code) and a drain of a rate-limited
kind under faults at their round trips (issue 38, points 3 and 9; I22)."""

from __future__ import annotations

import pytest

from tests.faults.rates_scenario import RATES_START
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _rate_sync(trip) -> bool:
    return "INSERT INTO jobs_kindrate" in trip.statement


def _rate_take(trip) -> bool:
    """The runner's statement that claims, and so takes the kind's token."""
    return "jobs_runner_step_v" in trip.statement  # v6 (v5: the previous release's)


@pytest.mark.django_db(transaction=True)
def test_the_rate_sync_and_the_rate_take_under_a_fault_of_each_kind(harness):
    """The sync never reaches the server: the start fails, the next start writes the rates;
    its answer is lost after it committed, or the process is killed right after it: the next
    start finds nothing to change. The claim that takes the token never reaches the server
    (no token spent, nothing claimed), commits with its answer lost, or is the last thing the
    process does (a token spent on a job the reaper gives back): every job runs once, and
    the rate holds."""
    outcomes = harness.cases(
        RATES_START,
        [
            (ERROR_BEFORE, _rate_sync, 0),
            (LOST_ANSWER, _rate_sync, 0),
            (KILL_AFTER, _rate_sync, 0),
            (ERROR_BEFORE, _rate_take, 0),
            (LOST_ANSWER, _rate_take, 0),
            (KILL_AFTER, _rate_take, 0),
        ],
    )
    report("rates-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_start_with_rates_under_every_fault(harness):
    outcomes = harness.enumerate(RATES_START)
    report("rates-all", outcomes)
    assert_held(outcomes, all_fired=False)
