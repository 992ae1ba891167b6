"""What a sweep plans per user (notifications/sweep_plan.py): the review-request cadence.

A PI on the daily or weekly rung is asked to review one proposal at a time, at most once per
calendar day (daily) or seven days (weekly), however many proposals wait and however often
the sweep runs (every few minutes in production).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail

from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_proposal_reviews

pytestmark = pytest.mark.django_db

Kind = EmailNotification.Kind
Rung = NotificationPreference.Rung
MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize("rung", [Rung.DAILY, Rung.WEEKLY])
def test_two_sweeps_on_the_same_day_send_one_review_request(make_pi, rung):
    pi = make_pi(proposals=3, rung=rung)

    first = sweep_proposal_reviews(now=MONDAY_9)
    second = sweep_proposal_reviews(now=MONDAY_9 + timedelta(hours=14))  # 23:00, same day

    assert (first.sent, second.sent) == (1, 0)
    assert [message.to for message in mail.outbox] == [[pi.email]]
    requests = EmailNotification.objects.filter(user=pi, kind=Kind.PROPOSAL_REVIEW)
    assert requests.count() == 1
    # Two proposals are still unasked: only the cadence held them back.
    assert pi.proposals.exclude(pk=requests.get().proposal_id).count() == 2
