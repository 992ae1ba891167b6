"""Issue 23.2: the suppression list's rules, and the sweeps and notices that honour it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import DeliveryFeedback, EmailNotification, Proposal, Suppression
from notifications.suppression import address_is_suppressed, feedback_record, suppression_lift
from notifications.sweeps import sweep_new_proposals, sweep_proposal_reviews

pytestmark = pytest.mark.django_db
Kind = DeliveryFeedback.Kind
Status = EmailNotification.Status


def _soft(address: str, at) -> None:
    feedback_record(address=address, kind=Kind.SOFT_BOUNCE, source="dsn", report="4.2.2", now=at)


def test_three_soft_bounces_in_seven_days_suppress_for_seven_days():
    t0 = timezone.now()
    _soft("full@example.net", t0 - timedelta(days=8))  # outside the window
    _soft("full@example.net", t0 - timedelta(days=3))
    _soft("full@example.net", t0 - timedelta(days=1))
    assert not address_is_suppressed("full@example.net", now=t0)
    _soft("Full@Example.net", t0)
    assert address_is_suppressed("full@example.net", now=t0)
    suppression = Suppression.objects.get()
    assert suppression.reason == "soft_bounces"
    assert suppression.expires_at == t0 + timedelta(days=7)
    assert not address_is_suppressed("full@example.net", now=t0 + timedelta(days=7, seconds=1))


def test_a_hard_bounce_or_a_complaint_suppresses_for_good_and_a_soft_one_never_shortens_it():
    t0 = timezone.now()
    feedback_record(
        address="gone@example.net", kind=Kind.HARD_BOUNCE, source="dsn", report="5.1.1", now=t0
    )
    for days in range(3):
        _soft("gone@example.net", t0 + timedelta(days=days))
    suppression = Suppression.objects.get()
    assert (suppression.reason, suppression.expires_at) == ("hard_bounce", None)
    feedback_record(
        address="angry@example.net", kind=Kind.COMPLAINT, source="arf", report="abuse", now=t0
    )
    assert address_is_suppressed("angry@example.net", now=t0 + timedelta(days=365))


def test_a_lifted_suppression_mails_the_address_again(make_pi):
    pi = make_pi()
    now = timezone.now()
    feedback_record(address=pi.email, kind=Kind.COMPLAINT, source="arf", report="x", now=now)
    assert sweep_new_proposals(now=now).suppressed == 1
    suppression = Suppression.objects.get()
    assert suppression_lift(suppression=suppression, by="operator", now=now)
    # Another proposal for the same PI is mailed now.
    Proposal.objects.create(pi=pi, title="Second", status=Proposal.Status.IN_REVIEW)
    assert sweep_new_proposals(now=now).sent == 1


def test_a_suppressed_address_gets_one_suppressed_review_request_not_one_per_cycle(make_pi):
    pi = make_pi()
    now = timezone.now()
    feedback_record(address=pi.email, kind=Kind.HARD_BOUNCE, source="dsn", report="x", now=now)
    first = sweep_proposal_reviews(now=now)
    second = sweep_proposal_reviews(now=now + timedelta(minutes=5))
    assert (first.suppressed, first.sent, second.suppressed, second.users) == (1, 0, 0, 0)
    assert EmailNotification.objects.get(user=pi).status == Status.SUPPRESSED


def test_a_pending_retry_to_an_address_that_bounced_meanwhile_is_suppressed(make_pi):
    pi = make_pi()
    now = timezone.now()
    row = EmailNotification.objects.create(
        user=pi, kind="new_proposal", proposal=pi.proposals.get(), to_address=pi.email
    )
    feedback_record(address=pi.email, kind=Kind.HARD_BOUNCE, source="dsn", report="x", now=now)
    assert sweep_new_proposals(now=now).suppressed == 1
    row.refresh_from_db()
    assert row.status == Status.SUPPRESSED
