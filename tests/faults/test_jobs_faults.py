"""The job runner under faults at its round trips (issue 30; I4, I5, I21, I22).

The named cases run in the default suite; the whole enumeration runs with
`-m fault_enumeration` (or `-m slow`). The two named cases below were issue 29's defects,
found by the enumeration on the runner before its fix (they failed there) and kept as
regression tests: the keeper's give-back whose answer is lost, and a completion batched
behind later jobs.
"""

from __future__ import annotations

import pytest

from tests.faults.jobs_scenario import (
    JOBS_DRAIN,
    JOBS_DRAIN_NO_GIVE_BACK,
    JOBS_DRAIN_SLOW_ENDS_AT_FAULT,
)
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _step(trip) -> bool:
    return "jobs_runner_step" in trip.statement


def _keeper_step(trip) -> bool:
    """The keeper's statements run on the drain's second connection."""
    return _step(trip) and trip.connection > 1


@pytest.mark.django_db(transaction=True)
def test_a_drain_survives_a_fault_of_each_kind_at_its_claim_and_a_handler_commit(harness):
    """A claim that never reaches the server is retried; a handler's commit whose answer is
    lost is not run again; a drain killed right after its claim leaves the jobs to the
    reaper, which charges the attempt, and each runs once."""
    outcomes = harness.cases(
        JOBS_DRAIN,
        [
            (ERROR_BEFORE, _step, 0),
            (LOST_ANSWER, lambda trip: trip.statement == "COMMIT", 0),
            (KILL_AFTER, _step, 0),
        ],
    )
    report("jobs-named", outcomes)
    assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_the_keepers_give_back_that_commits_then_loses_its_answer_runs_no_job_twice(harness):
    """Issue 29 point 2: the keeper's give-back commits, its answer is lost; the keeper once
    put the released jobs back in its batch and they ran twice.

    The give-back is the keeper's first statement (0.2 s into the slow job); the slow job
    ends the moment the connection is cut, so the drain reaches the jobs the keeper put
    back before it looks again."""
    outcomes = harness.case(JOBS_DRAIN_SLOW_ENDS_AT_FAULT, LOST_ANSWER, _keeper_step)
    report("jobs-keeper-give-back-lost-answer", outcomes)
    assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_kill_while_a_failure_is_recorded_does_not_rerun_the_job_before_it(harness):
    """Issue 29 point 1: a completion batched behind later jobs was not durable, so a kill
    re-ran a job that was no longer in flight.

    The `atomic=False` job and the non-idempotent one ran before the failing one; their
    completions wait for the next step (no give-back here, so the keeper sends none). A kill
    right after the failure's UPDATE re-runs them although they were not in flight."""
    outcomes = harness.case(
        JOBS_DRAIN_NO_GIVE_BACK, KILL_AFTER, lambda trip: '"last_error" = ?' in trip.statement
    )
    report("jobs-failure-record-kill-after", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_drain_under_every_fault(harness):
    outcomes = harness.enumerate(JOBS_DRAIN) + harness.enumerate(
        JOBS_DRAIN_SLOW_ENDS_AT_FAULT,
        kinds=[LOST_ANSWER],
        select_trips=lambda trips: [trip for trip in trips if _keeper_step(trip)],
    )
    report("jobs-all", outcomes)
    assert_held(outcomes, all_fired=False)
