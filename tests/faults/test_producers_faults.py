"""Unique inserts and pruning under faults at their round trips (issue 38, point 9; I22)."""

from __future__ import annotations

import pytest

from tests.faults.producers_scenario import PRODUCERS
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _unique_insert(trip) -> bool:
    return "jobs_enqueue_unique" in trip.statement


def _bulk_insert(trip) -> bool:
    return "jsonb_array_elements" in trip.statement


def _prune(trip) -> bool:
    return trip.statement.lstrip().startswith("DELETE FROM jobs_job WHERE")


def _key_prune(trip) -> bool:
    return trip.statement.lstrip().startswith("DELETE FROM jobs_jobuniquekey")


@pytest.mark.django_db(transaction=True)
def test_unique_inserts_and_pruning_hold_under_a_fault_of_each_kind(harness):
    """The unique insert's answer is lost after it committed, and it is sent again: the
    repeat returns the job, inserts nothing. The bulk insert fails before it is sent, and
    the process is killed right after it: one job per key either way. A prune batch's answer
    is lost, and the process is killed right after the batch that deletes an expired unique
    key: the next run deletes the rest, nothing more, and a key still in its period stays."""
    outcomes = harness.cases(
        PRODUCERS,
        [
            (LOST_ANSWER, _unique_insert, 1),
            (ERROR_BEFORE, _bulk_insert, 0),
            (KILL_AFTER, _bulk_insert, 0),
            (LOST_ANSWER, _prune, 0),
            (KILL_AFTER, _key_prune, 0),
        ],
    )
    report("producers-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_the_producers_under_every_fault(harness):
    outcomes = harness.enumerate(PRODUCERS)
    report("producers-all", outcomes)
    assert_held(outcomes, all_fired=False)
