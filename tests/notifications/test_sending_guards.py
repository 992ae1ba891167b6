"""Ownership guards of the writes that follow a notification claim (issue 14).

A claim is identified by its `claimed_at`. A worker whose claim timed out (its mail service
call hung past NOTIFICATION_CLAIM_TIMEOUT_SECONDS) may report back after the reconciler
handed the row back and another worker claimed it again: its report must not touch the
other worker's claim. docs/architecture.md lists the mutants these were seen failing on.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker

from notifications.models import EmailNotification
from notifications.sending import (
    notification_mark_sent,
    notification_reconcile_stale_claims,
    notification_record_send_failure,
    notification_release_claims,
)

Status = EmailNotification.Status


@pytest.fixture
def reclaimed(make_pi, settings):
    """A notice first claimed by worker A long ago, handed back by the reconciler, then
    claimed again by worker B (`sending` with B's claimed_at, the attempt counted)."""
    pi = make_pi()
    now = timezone.now()
    first_claim = now - timedelta(seconds=settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS + 60)
    row = baker.make(
        EmailNotification,
        user=pi,
        kind=EmailNotification.Kind.NEW_PROPOSAL,
        proposal=pi.proposals.get(),
        to_address=pi.email,
        status=Status.SENDING,
        claimed_at=first_claim,
        attempts=1,
    )
    assert notification_reconcile_stale_claims(kind=row.kind, now=now) == 1
    second_claim = now
    assert (
        EmailNotification.objects.filter(pk=row.pk, status=Status.PENDING).update(
            status=Status.SENDING, claimed_at=second_claim, attempts=2
        )
        == 1
    )
    return row, first_claim, second_claim


@pytest.mark.django_db
def test_a_late_send_failure_of_a_timed_out_claim_leaves_the_new_claim_alone(reclaimed):
    row, first_claim, second_claim = reclaimed

    status = notification_record_send_failure(
        notification_id=row.pk,
        claimed_at=first_claim,
        attempt=1,
        error="ReadTimeout: SES did not answer",
        now=timezone.now(),
    )

    assert status is None
    row.refresh_from_db()
    assert (row.status, row.claimed_at, row.attempts, row.last_error) == (
        Status.SENDING,
        second_claim,
        2,
        "claim timed out (worker crashed while sending?)",
    )
    # The second worker's send is the one that counts.
    assert notification_mark_sent(
        notification_id=row.pk,
        message_id="second-worker-message",
        sent_at=timezone.now(),
        expires_at=timezone.now() + timedelta(days=7),
    )
    row.refresh_from_db()
    assert (row.status, row.ses_message_id) == (Status.SENT, "second-worker-message")


@pytest.mark.django_db
def test_handing_back_a_timed_out_claim_leaves_the_new_claim_alone(reclaimed):
    row, first_claim, second_claim = reclaimed

    assert notification_release_claims(claims=[(row.pk, first_claim)], now=timezone.now()) == 0

    row.refresh_from_db()
    assert (row.status, row.claimed_at, row.attempts) == (Status.SENDING, second_claim, 2)
