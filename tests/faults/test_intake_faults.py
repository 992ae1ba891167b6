"""The inbound poller under faults at its round trips (issue 30; I6, I8, I22)."""

from __future__ import annotations

import pytest

from tests.faults.intake_scenario import INTAKE_POLL
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, assert_held, report


@pytest.mark.django_db(transaction=True)
def test_a_poll_loses_no_mail_and_handles_none_twice_under_a_fault_of_each_kind(harness):
    """A mail claim that commits then loses its answer (the row leased, the poller never
    knew: the mail waits in the intake); a reply INSERT that never reaches the server (the
    mail is retried, its reply recorded once); a poller killed right after a mail's outcome
    committed (the next poll cleans the intake up)."""
    outcomes = harness.cases(
        INTAKE_POLL,
        [
            (LOST_ANSWER, lambda trip: "SET attempts = attempts + ?" in trip.statement, 0),
            (ERROR_BEFORE, lambda trip: 'INSERT INTO "inbound_email_reply"' in trip.statement, 0),
            (KILL_AFTER, lambda trip: trip.statement == "COMMIT", 1),
        ],
    )
    report("intake-named", outcomes)
    assert_held(outcomes)


@pytest.mark.fault_enumeration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_round_trip_of_a_poll_under_every_fault(harness):
    outcomes = harness.enumerate(INTAKE_POLL)
    report("intake-all", outcomes)
    assert_held(outcomes, all_fired=False)
