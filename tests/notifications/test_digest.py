"""Digest: daily/weekly-rung users get a summary of their proposals in review when due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail

from notifications.models import EmailNotification
from notifications.sweeps import sweep_digests

pytestmark = pytest.mark.django_db
MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_daily_digest_once_per_calendar_day(make_pi):
    pi = make_pi(proposals=2, rung="daily")
    make_pi(rung="immediate")  # immediate users get no digest
    assert sweep_digests(now=MONDAY_9).sent == 1
    [message] = mail.outbox
    assert message.to == [pi.email]
    assert message.subject == "Your proposal digest: 2 in review"
    for proposal in pi.proposals.all():
        assert proposal.title in message.body
    assert sweep_digests(now=MONDAY_9 + timedelta(hours=14)).sent == 0  # same day, 23:00
    assert sweep_digests(now=MONDAY_9 + timedelta(hours=15)).sent == 1  # next day, 00:00
    rows = EmailNotification.objects.filter(user=pi, kind="digest")
    assert rows.count() == 2 and all(row.proposal_id is None for row in rows)


def test_weekly_digest_every_seven_days(make_pi):
    make_pi(rung="weekly")
    sent = [sweep_digests(now=MONDAY_9 + timedelta(days=day)).sent for day in range(15)]
    assert sent == [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1]


def test_no_digest_without_proposals_in_review(make_pi):
    make_pi(proposals=0, rung="daily")
    assert sweep_digests(now=MONDAY_9).users == 0
