"""The job runner under every fault at every round trip (issue 30; I4, I5, I21, I22).

The named cases run in the default suite; the whole enumeration is marked slow. Cases
that fail on today's runner are issue 29's (wt-runner fixes the runner): they are kept as
strict expected failures, to be flipped when that fix lands.
"""

from __future__ import annotations

import pytest

from tests.faults.jobs_scenario import JOBS_DRAIN, JOBS_DRAIN_SLOW_ENDS_AT_FAULT
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, report

ISSUE_29_BATCH = (
    "issue 29 point 1: a completion batched behind later jobs is not durable, so a kill "
    "re-runs a job that was no longer in flight"
)
ISSUE_29_KEEPER = (
    "issue 29 point 2: the keeper's give-back commits, its answer is lost, it puts the "
    "released jobs back in its batch and they run twice"
)


def _step(trip) -> bool:
    return "jobs_runner_step" in trip.statement


def _assert_held(outcomes) -> None:
    faulted = outcomes[-1]
    assert faulted.fired, f"the fault never fired: {faulted.fault}"
    assert [o.violations for o in outcomes] == [[] for _ in outcomes], faulted.log


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_never_reaches_the_server_is_retried_and_every_job_runs_once(harness):
    outcomes = harness.case(JOBS_DRAIN, ERROR_BEFORE, _step)
    report("jobs-claim-error-before", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_handler_commit_whose_answer_is_lost_is_not_run_again(harness):
    outcomes = harness.case(JOBS_DRAIN, LOST_ANSWER, lambda trip: trip.statement == "COMMIT")
    report("jobs-handler-commit-lost-answer", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_drain_killed_right_after_its_claim_leaves_the_jobs_to_the_reaper(harness):
    outcomes = harness.case(JOBS_DRAIN, KILL_AFTER, _step)
    report("jobs-claim-kill-after", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
@pytest.mark.xfail(strict=True, reason=ISSUE_29_KEEPER)
def test_the_keepers_give_back_that_commits_then_loses_its_answer_runs_no_job_twice(harness):
    """The give-back is the keeper's first statement (on its own connection)."""
    outcomes = harness.case(
        JOBS_DRAIN_SLOW_ENDS_AT_FAULT, LOST_ANSWER, lambda trip: _step(trip) and trip.connection > 1
    )
    report("jobs-keeper-give-back-lost-answer", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
@pytest.mark.xfail(strict=True, reason=ISSUE_29_BATCH)
def test_a_kill_while_a_failure_is_recorded_does_not_rerun_the_job_before_it(harness):
    """The `atomic=False` job ran before the failing one; its completion waits for the next
    step. A kill right after the failure's UPDATE re-runs it although it was not in flight."""
    outcomes = harness.case(
        JOBS_DRAIN, KILL_AFTER, lambda trip: '"last_error" = ?' in trip.statement
    )
    report("jobs-failure-record-kill-after", outcomes)
    _assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.django_db(transaction=True)
@pytest.mark.xfail(strict=True, reason=f"{ISSUE_29_BATCH}; {ISSUE_29_KEEPER}")
def test_every_round_trip_of_a_drain_under_every_fault(harness):
    outcomes = harness.enumerate(JOBS_DRAIN) + harness.enumerate(
        JOBS_DRAIN_SLOW_ENDS_AT_FAULT,
        kinds=[LOST_ANSWER],
        select_trips=lambda trips: [trip for trip in trips if _step(trip) and trip.connection > 1],
    )
    report("jobs-all", outcomes)
    assert [o for o in outcomes if o.violations] == []
