"""The inbound poller under every fault at every round trip (issue 30; I6, I8, I22)."""

from __future__ import annotations

import pytest

from tests.faults.intake_scenario import INTAKE_POLL
from tests.support.fault_harness import ERROR_BEFORE, KILL_AFTER, LOST_ANSWER, report


def _assert_held(outcomes) -> None:
    faulted = outcomes[-1]
    assert faulted.fired, f"the fault never fired: {faulted.fault}"
    assert [o.violations for o in outcomes] == [[] for _ in outcomes], faulted.log


@pytest.mark.django_db(transaction=True)
def test_a_mail_claim_that_commits_then_loses_its_answer_loses_no_mail(harness):
    """The claim counted the attempt and leased the row; the poller never learnt it."""
    outcomes = harness.case(
        INTAKE_POLL, LOST_ANSWER, lambda trip: "SET attempts = attempts + ?" in trip.statement
    )
    report("intake-claim-lost-answer", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_reply_insert_that_never_reaches_the_server_records_the_reply_once(harness):
    outcomes = harness.case(
        INTAKE_POLL,
        ERROR_BEFORE,
        lambda trip: 'INSERT INTO "inbound_email_reply"' in trip.statement,
    )
    report("intake-reply-error-before", outcomes)
    _assert_held(outcomes)


@pytest.mark.django_db(transaction=True)
def test_a_poller_killed_after_a_mails_outcome_committed_leaves_it_handled_once(harness):
    """Killed between the commit and the store's clean-up: the next poll cleans up."""
    outcomes = harness.case(INTAKE_POLL, KILL_AFTER, lambda trip: trip.statement == "COMMIT", nth=1)
    report("intake-outcome-kill-after", outcomes)
    _assert_held(outcomes)
