"""The new-proposal sweep under faults at its round trips (issue 30; I11-I13, I22)."""

from __future__ import annotations

import pytest

from tests.faults.sweeps_scenario import NEW_PROPOSAL_SWEEP
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _record_sent(trip) -> bool:
    return '"ses_message_id" = ?' in trip.statement


@pytest.mark.django_db(transaction=True)
def test_a_sweep_sends_each_notice_once_under_a_fault_of_each_kind(harness):
    """The record of a send never reaches the server: recorded again on a fresh connection,
    not sent again. The claims' commit loses its answer: the cycle ends, the claims time out
    and the next cycle sends each once. Killed right after the record: nothing is resent."""
    outcomes = harness.cases(
        NEW_PROPOSAL_SWEEP,
        [
            (ERROR_BEFORE, _record_sent, 0),
            (LOST_ANSWER, lambda trip: trip.statement == "COMMIT", 0),
            (KILL_AFTER, _record_sent, 0),
        ],
    )
    report("sweeps-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_sweep_under_every_fault(harness):
    outcomes = harness.enumerate(NEW_PROPOSAL_SWEEP)
    report("sweeps-all", outcomes)
    assert_held(outcomes, all_fired=False)
