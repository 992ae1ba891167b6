"""The PostgreSQL one-statement expiry (expire + ladder upsert) behaves exactly like the ORM path
the embedded SQLite default runs (notifications_expire, then preference_record_missed)."""

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


@pytest.mark.parametrize(
    ("preference", "statuses"),
    [
        (MISSING, [OVERDUE]),  # first miss of a user on the defaults: row created, count 1
        (MISSING, [OVERDUE, OVERDUE, OVERDUE]),  # three at once: straight to daily
        (MISSING, [OVERDUE] * 5),  # one rung per cycle, the count resets to 0
        ((Rung.IMMEDIATE, 1), [OVERDUE]),
        ((Rung.IMMEDIATE, 2), [OVERDUE]),  # the third miss: immediate -> daily
        ((Rung.DAILY, 2), [OVERDUE, OVERDUE]),  # daily -> weekly
        ((Rung.WEEKLY, 2), [OVERDUE]),  # weekly -> paused
        ((Rung.PAUSED, 7), [OVERDUE]),  # paused is the bottom: the count just grows
        # Guards: not overdue yet, answered, already expired -> nothing expires, nothing counted
        ((Rung.IMMEDIATE, 2), [(Status.SENT, 5), (Status.RESPONDED, -1), (Status.EXPIRED, -1)]),
        (MISSING, [(Status.SENT, 5)]),  # nothing expired: no preference row is created
        ((Rung.IMMEDIATE, 2), [(Status.SENT, 5), OVERDUE]),  # only the overdue one counts
    ],
)
def test_postgresql_statement_and_orm_path_agree(preference, statuses, caplog):
    """Same start, same call, on two users: same result, same rows, same step-down log."""
    now = timezone.now()
    outcomes = []
    for path in (services._review_requests_expire_orm, services._review_requests_expire_upsert):
        user, ids = _user_with_requests(preference, statuses)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="notifications.services"):
            result = path(user_id=user.pk, notification_ids=ids, now=now)
        logs = [
            (r.user_id == user.pk, r.from_rung, r.to_rung)
            for r in caplog.records
            if getattr(r, "action", "") == "notification_rung_down"
        ]
        outcomes.append((result, _state(user, ids), logs))
    assert outcomes[0] == outcomes[1]


def test_upsert_never_expires_a_row_with_an_accepted_reply():
    """The reply guard of notifications_expire holds inside the one statement too."""
    user, ids = _user_with_requests((Rung.IMMEDIATE, 2), [OVERDUE, OVERDUE])
    baker.make("inbound_email.Reply", notification_id=ids[0])
    result = services.review_requests_expire(
        user_id=user.pk, notification_ids=ids, now=timezone.now()
    )
    assert (result.expired, result.rung, result.stepped_down) == (1, Rung.DAILY, True)
    assert _state(user, ids)[1] == [Status.SENT, Status.EXPIRED]
