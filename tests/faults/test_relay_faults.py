"""The Slack relay under faults at its round trips (issue 30; I8, I22)."""

from __future__ import annotations

import pytest

from tests.faults.relay_scenario import SLACK_RELAY
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


def _relay_commit(trip) -> bool:
    return trip.statement == "COMMIT" and trip.connection == 1


@pytest.mark.django_db(transaction=True)
def test_a_relay_posts_exactly_once_under_a_fault_of_each_kind(harness):
    """The claim (`posting`, attempt counted) commits and its answer is lost: the claim
    times out and the next attempt looks before it posts, once. The record of the post
    never reaches the server: the next attempt finds the message, posts nothing. Killed
    right after the record committed, before the job's completion: nothing more is posted."""
    outcomes = harness.cases(
        SLACK_RELAY,
        [
            (LOST_ANSWER, _relay_commit, 0),
            (
                ERROR_BEFORE,
                lambda trip: '"notifications_emailnotification" SET' in trip.statement,
                0,
            ),
            (KILL_AFTER, _relay_commit, 1),
        ],
    )
    report("relay-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_relay_under_every_fault(harness):
    outcomes = harness.enumerate(SLACK_RELAY)
    report("relay-all", outcomes)
    assert_held(outcomes, all_fired=False)
