"""I13: unanswered notifications expire (written), misses count, the ladder steps down."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker

from notifications.models import EmailNotification, NotificationPreference, Proposal
from notifications.services import (
    MISSED_THRESHOLD,
    notification_mark_responded,
    preference_restore_rung,
)
from notifications.sweeps import sweep_digests, sweep_new_proposals, sweep_proposal_reviews

Status = EmailNotification.Status
Rung = NotificationPreference.Rung
HOUR = timedelta(hours=1)

pytestmark = pytest.mark.django_db


def _preference(user) -> NotificationPreference:
    return NotificationPreference.objects.get(user=user)


def _open_request(user, proposal) -> EmailNotification:
    return EmailNotification.objects.get(
        user=user, proposal=proposal, kind="proposal_review", status=Status.SENT
    )


def test_three_expiries_step_down_one_rung_while_another_request_is_outstanding(
    make_pi, ses, settings, caplog
):
    """Defect V4: "expired" was never written, and consecutive_missed was bumped only past an
    early return taken whenever an unanswered `sent` row existed, so the count capped at 1.

    Here the PI always has a second, not yet overdue, unanswered request outstanding when one
    expires: each expiry must still be written and counted; the third steps the PI down.
    """
    settings.NOTIFICATION_REVIEW_EXPIRY_HOURS = 72
    pi = make_pi(proposals=1)
    first = pi.proposals.get()
    t0 = timezone.now()

    assert sweep_proposal_reviews(now=t0).sent == 1  # asks about `first` (expires t0+72h)
    second = baker.make(Proposal, pi=pi, title="Second", status=Proposal.Status.IN_REVIEW)
    assert sweep_proposal_reviews(now=t0 + 48 * HOUR).sent == 1  # `second`, expires t0+120h

    misses = []
    for at, expiring, outstanding in [
        (t0 + 73 * HOUR, first, second),  # re-asks `first`, expires t0+145h
        (t0 + 121 * HOUR, second, first),  # re-asks `second`, expires t0+193h
        (t0 + 146 * HOUR, first, second),
    ]:
        outstanding_row = _open_request(pi, outstanding)
        with caplog.at_level(logging.INFO, logger="notifications.services"):
            summary = sweep_proposal_reviews(now=at)
        assert summary.expired == 1
        assert EmailNotification.objects.filter(
            user=pi, proposal=expiring, status=Status.EXPIRED
        ).exists()
        assert EmailNotification.objects.get(pk=outstanding_row.pk).status == Status.SENT
        misses.append((_preference(pi).consecutive_missed, _preference(pi).rung))

    assert misses == [(1, Rung.IMMEDIATE), (2, Rung.IMMEDIATE), (0, Rung.DAILY)]
    assert MISSED_THRESHOLD == 3
    assert _preference(pi).downgraded_at is not None
    assert EmailNotification.objects.filter(user=pi, status=Status.EXPIRED).count() == 3
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "notification_rung_down"]
    assert (record.user_id, record.from_rung, record.to_rung) == (pi.pk, "immediate", "daily")


def test_a_reply_resets_the_missed_count(make_pi, ses):
    """V4: a reply sets the missed count back to 0 and the rung holds."""
    pi = make_pi()
    proposal = pi.proposals.get()
    t0 = timezone.now()
    sweep_proposal_reviews(now=t0)
    sweep_proposal_reviews(now=t0 + 73 * HOUR)  # miss 1, re-ask
    sweep_proposal_reviews(now=t0 + 146 * HOUR)  # miss 2, re-ask
    assert _preference(pi).consecutive_missed == 2

    notification_mark_responded(notification_id=_open_request(pi, proposal).pk)
    assert _preference(pi).consecutive_missed == 0

    # Answered: the proposal is not asked again, so nothing expires and the rung holds.
    summary = sweep_proposal_reviews(now=t0 + 300 * HOUR)
    assert (summary.sent, summary.expired) == (0, 0)
    assert (_preference(pi).consecutive_missed, _preference(pi).rung) == (0, Rung.IMMEDIATE)


def test_weekly_user_steps_down_to_paused(make_pi, ses):
    pi = make_pi(rung=Rung.WEEKLY)
    NotificationPreference.objects.filter(user=pi).update(consecutive_missed=MISSED_THRESHOLD - 1)
    t0 = timezone.now()
    assert sweep_proposal_reviews(now=t0).sent == 1
    summary = sweep_proposal_reviews(now=t0 + 8 * 24 * HOUR)
    assert (summary.expired, summary.stepped_down, summary.sent) == (1, 1, 0)
    assert _preference(pi).rung == Rung.PAUSED


def test_paused_user_gets_nothing_until_restored(make_pi, ses):
    pi = make_pi(proposals=2, rung=Rung.PAUSED)
    t0 = timezone.now()
    for day in range(3):
        now = t0 + timedelta(days=day * 8)
        for sweep in (sweep_new_proposals, sweep_proposal_reviews, sweep_digests):
            assert sweep(now=now).sent == 0
    assert ses.messages == [] and not EmailNotification.objects.exists()

    preference_restore_rung(user_id=pi.pk)
    assert sweep_proposal_reviews(now=t0 + 30 * 24 * HOUR).sent == 2
    assert _preference(pi).rung == Rung.IMMEDIATE


def test_expired_new_proposal_notice_is_written_but_not_counted(make_pi, ses, settings):
    pi = make_pi()
    t0 = timezone.now()
    assert sweep_new_proposals(now=t0).sent == 1
    later = t0 + timedelta(hours=settings.NOTIFICATION_REPLY_WINDOW_HOURS + 1)
    summary = sweep_new_proposals(now=later)
    assert (summary.expired, summary.sent) == (1, 0)  # expired, and never sent twice
    assert EmailNotification.objects.get(user=pi).status == Status.EXPIRED
    assert not NotificationPreference.objects.filter(user=pi, consecutive_missed__gt=0).exists()
