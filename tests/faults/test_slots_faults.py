"""The runner with several slots busy under faults (issue 37, point 5; I21, I22).

Four thread slots and two event-loop slots run at once; completions of several slots share
the drain's statements and commits. The named cases run in the default suite; the whole
enumeration (every round trip under each fault kind, and every round trip with the server
crashed right after it, on a throwaway cluster) runs with `-m fault_enumeration`.
"""

from __future__ import annotations

import pytest

from tests.faults.jobs_scenario import JOBS_DRAIN
from tests.faults.slots_scenario import SLOTS_DRAIN
from tests.support.fault_harness import (
    CRASH_AFTER,
    ERROR_BEFORE,
    KILL_AFTER,
    LOST_ANSWER,
    assert_held,
    report,
)


def _drain_step(trip) -> bool:
    """The drain's own statement (its first connection): completions and the next claim."""
    return "jobs_runner_step" in trip.statement and trip.connection == 1


def _due_poll(trip) -> bool:
    """The drain's poll for due jobs while it waits for a slot to end."""
    return "django_q_ormq" in trip.statement and trip.connection == 1


def _slot_commit(trip) -> bool:
    """A slot's COMMIT: an atomic handler's writes with its completion, or an `atomic=False`
    handler's own step (the drain's and the keeper's statements commit alone)."""
    return trip.statement == "COMMIT" and trip.connection not in (1, 5)


@pytest.mark.django_db(transaction=True)
def test_a_drain_with_slots_busy_survives_a_fault_of_each_kind(harness):
    """The drain's second statement carries the completions of the first wave (several slots,
    thread and async, that ended together) and the next claim: it never reaches the server,
    or its answer is lost after it committed, or the process is killed right after it. A
    slot's own commit is killed right after too. Every job's effect happens once but for the
    jobs in flight at a kill (at most one per slot), none is lost, and the slots shared a
    commit."""
    outcomes = harness.cases(
        SLOTS_DRAIN,
        [
            (ERROR_BEFORE, _drain_step, 1),
            (LOST_ANSWER, _drain_step, 1),
            (KILL_AFTER, _drain_step, 1),
            (KILL_AFTER, _slot_commit, 0),
        ],
    )
    report("slots-named", outcomes)
    assert_held(outcomes)
    # Several slots' completions in one commit, in at least one of these runs.
    shared = SLOTS_DRAIN.shared_commits[-len(outcomes) :]
    assert max(shared) >= 2, f"no commit carried several slots' completions: {shared}"


@pytest.mark.django_db(transaction=True)
def test_a_shared_durable_commit_survives_a_crash_of_the_server(crash_harness):
    """PostgreSQL is stopped at once (`pg_ctl stop -m immediate`) right after the drain's
    statement that completes several slots' jobs, and after a slot's own commit, then
    started again: every completion of a kind not declared idempotent that committed before
    the crash is there after the restart, and no job whose completion the drain saw runs
    again; only the jobs in flight at the crash may (their claims or runs died with it)."""
    outcomes = crash_harness.cases(
        SLOTS_DRAIN, [(CRASH_AFTER, _drain_step, 1), (CRASH_AFTER, _slot_commit, 0)]
    )
    report("slots-crash-named", outcomes)
    assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_at_the_drains_poll_loses_no_completion(harness):
    """Found by the enumeration: the drain's poll for due jobs, while a non-idempotent job
    still ran in a slot, met a lost connection; the error ended the drain (the pass exited
    with it), that job's completion was then sent on the dead connection and left to the
    reaper, and the job's external effect happened twice though no process died. The poll
    now reconnects as the drain's other statements do, so the drain goes on (the pass ends
    well), and the completions sent at the drain's end go once more on a fresh connection
    when the drain's is gone (tests/jobs/test_slot_connections.py shows that one alone)."""
    outcomes = harness.cases(
        SLOTS_DRAIN, [(ERROR_BEFORE, _due_poll, 0), (LOST_ANSWER, _due_poll, 0)]
    )
    report("slots-poll-named", outcomes)
    assert_held(outcomes)
    assert [outcome.exit for outcome in outcomes] == [0, 0, 0], "the poll's error ended the drain"


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_drain_with_slots_busy_under_every_fault(harness):
    outcomes = harness.enumerate(SLOTS_DRAIN)
    report("slots-all", outcomes)
    assert_held(outcomes, all_fired=False)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_the_drains_with_the_server_crashed_right_after_it(crash_harness):
    """The fourth fault kind over the runner's scenarios: the one-slot drain and the drain
    with slots busy, the server crashed after each of their round trips in turn."""
    outcomes = crash_harness.enumerate(SLOTS_DRAIN, kinds=[CRASH_AFTER])
    outcomes += crash_harness.enumerate(JOBS_DRAIN, kinds=[CRASH_AFTER])
    report("runner-crash-all", outcomes)
    assert_held(outcomes, all_fired=False)
