"""The one-statement expiry (the expiry guard + the ladder upsert) from every starting state."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from model_bakery import baker

from notifications import services
from notifications.models import EmailNotification, NotificationPreference, Proposal

pytestmark = pytest.mark.django_db

Status = EmailNotification.Status
Rung = NotificationPreference.Rung
HOUR = timedelta(hours=1)
MISSING = None  # no preference row yet: the defaults apply


def _user_with_requests(preference: tuple[str, int] | None, statuses: list[tuple[str, int]]):
    """A PI with review requests of (status, hours until expiry); returns (user, their ids)."""
    user = baker.make(get_user_model())
    if preference is not None:
        rung, missed = preference
        baker.make(NotificationPreference, user=user, rung=rung, consecutive_missed=missed)
    ids = []
    now = timezone.now()
    for status, hours in statuses:
        proposal = baker.make(Proposal, pi=user, status=Proposal.Status.IN_REVIEW)
        row = baker.make(
            EmailNotification,
            user=user,
            proposal=proposal,
            kind=EmailNotification.Kind.PROPOSAL_REVIEW,
            status=status,
            ses_message_id="m",
            sent_at=now - 100 * HOUR,
            expires_at=now + hours * HOUR,
            responded_at=now if status == Status.RESPONDED else None,
        )
        ids.append(row.pk)
    return user, ids


def _state(user, ids) -> tuple:
    preference = NotificationPreference.objects.filter(user=user).values_list(
        "rung", "consecutive_missed", "downgraded_at"
    )
    statuses = list(
        EmailNotification.objects.filter(pk__in=ids).order_by("pk").values_list("status", flat=True)
    )
    return list(preference), statuses


OVERDUE = (Status.SENT, -1)


EXPIRED, SENT, RESPONDED = Status.EXPIRED, Status.SENT, Status.RESPONDED
IMM, DAY, WEEK, PAUSE = Rung.IMMEDIATE, Rung.DAILY, Rung.WEEKLY, Rung.PAUSED


@pytest.mark.parametrize(
    ("preference", "statuses", "expired", "after", "rows_after"),
    [
        # first miss of a user on the defaults: row created, count 1
        (MISSING, [OVERDUE], 1, (IMM, 1), [EXPIRED]),
        (MISSING, [OVERDUE] * 3, 3, (DAY, 0), [EXPIRED] * 3),  # three at once: straight to daily
        (MISSING, [OVERDUE] * 5, 5, (DAY, 0), [EXPIRED] * 5),  # one rung per cycle, count reset
        ((IMM, 1), [OVERDUE], 1, (IMM, 2), [EXPIRED]),
        ((IMM, 2), [OVERDUE], 1, (DAY, 0), [EXPIRED]),  # the third miss: immediate -> daily
        ((DAY, 2), [OVERDUE, OVERDUE], 2, (WEEK, 0), [EXPIRED] * 2),  # daily -> weekly
        ((WEEK, 2), [OVERDUE], 1, (PAUSE, 0), [EXPIRED]),  # weekly -> paused
        ((PAUSE, 7), [OVERDUE], 1, (PAUSE, 8), [EXPIRED]),  # the bottom: the count just grows
        # Guards: not overdue yet, answered, already expired -> nothing expires, nothing counted
        (
            (IMM, 2),
            [(SENT, 5), (RESPONDED, -1), (EXPIRED, -1)],
            0,
            (IMM, 2),
            [SENT, RESPONDED, EXPIRED],
        ),
        (MISSING, [(SENT, 5)], 0, None, [SENT]),  # nothing expired: no preference row created
        ((IMM, 2), [(SENT, 5), OVERDUE], 1, (DAY, 0), [SENT, EXPIRED]),  # only the overdue
    ],
)
def test_expiry_and_ladder_from_each_starting_state(
    preference, statuses, expired, after, rows_after, caplog
):
    """Expired rows, the preference afterwards (rung, count, downgraded_at) and the
    step-down log, for each start (checked: fails with the threshold off by one)."""
    now = timezone.now()
    user, ids = _user_with_requests(preference, statuses)
    with caplog.at_level(logging.INFO, logger="notifications.services"):
        result = services.review_requests_expire(user_id=user.pk, notification_ids=ids, now=now)
    before_rung = preference[0] if preference else IMM
    stepped = after is not None and after[0] != before_rung
    assert (result.expired, result.rung, result.stepped_down) == (
        expired,
        after[0] if expired else None,
        stepped,
    )
    expected_preference = [] if after is None else [(*after, now if stepped else None)]
    assert _state(user, ids) == (expected_preference, rows_after)
    logs = [
        (r.user_id, r.from_rung, r.to_rung)
        for r in caplog.records
        if getattr(r, "action", "") == "notification_rung_down"
    ]
    assert logs == ([(user.pk, before_rung, after[0])] if stepped else [])


def test_upsert_never_expires_a_row_with_an_accepted_reply():
    """The reply guard of notifications_expire holds inside the one statement too."""
    user, ids = _user_with_requests((Rung.IMMEDIATE, 2), [OVERDUE, OVERDUE])
    baker.make("inbound_email.Reply", notification_id=ids[0])
    result = services.review_requests_expire(
        user_id=user.pk, notification_ids=ids, now=timezone.now()
    )
    assert (result.expired, result.rung, result.stepped_down) == (1, Rung.DAILY, True)
    assert _state(user, ids)[1] == [Status.SENT, Status.EXPIRED]
