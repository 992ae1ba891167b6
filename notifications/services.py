"""State changes of notifications and preferences. Every write goes through a named function.

Here: replies, the missed-reply ladder and expiry, and operator actions. The claim/send
path of a sweep (sent, refused, handed back, reconciled) is in sending.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from notifications.exceptions import NotificationNotOpen, NotificationNotRetryable
from notifications.models import EmailNotification, NotificationPreference

logger = logging.getLogger(__name__)

Status = EmailNotification.Status
Rung = NotificationPreference.Rung

MISSED_THRESHOLD = 3  # consecutive expired review requests that step a user one rung down
LADDER: tuple[str, ...] = (Rung.IMMEDIATE, Rung.DAILY, Rung.WEEKLY, Rung.PAUSED)


def notification_mark_responded(
    *, notification_id: int, responded_at: datetime | None = None
) -> EmailNotification:
    """Mark a sent notification answered and reset the user's missed-reply count.

    Called by the inbound-email app only after the reply was handled durably (I8). Runs in
    the caller's transaction if there is one, so "responded" commits together with the reply.
    Raises NotificationNotOpen when the row is not in `sent` (already answered, expired, ...).
    """
    responded_at = responded_at or timezone.now()
    with transaction.atomic():
        notification = EmailNotification.objects.select_for_update().get(pk=notification_id)
        if notification.status != Status.SENT:
            raise NotificationNotOpen(
                f"notification {notification_id} is {notification.status}, not sent"
            )
        notification.status = Status.RESPONDED
        notification.responded_at = responded_at
        notification.save(update_fields=["status", "responded_at", "updated_at"])
        NotificationPreference.objects.get_or_create(user_id=notification.user_id)
        NotificationPreference.objects.filter(user_id=notification.user_id).update(
            consecutive_missed=0
        )
    logger.info(
        "notification %s marked responded",
        notification_id,
        extra={"action": "notification_responded", "notification_id": notification_id},
    )
    return notification


_RETRY_BLOCKED = {
    "one_unsent_digest_per_user": "the user already has an unsent digest (it lists the same "
    "proposals)",
    "one_open_review_request_per_user_and_proposal": "a review request for this proposal is "
    "already open",
}


def notification_retry_failed(*, notification_id: int) -> EmailNotification:
    """An operator's retry of a row that failed for good: pending again with fresh attempts."""
    with transaction.atomic():
        notification = EmailNotification.objects.select_for_update().get(pk=notification_id)
        if notification.status != Status.FAILED:
            raise NotificationNotOpen(
                f"notification {notification_id} is {notification.status}, not failed"
            )
        notification.status = Status.PENDING
        notification.attempts = 0
        notification.retry_after = None
        notification.failure_reason = EmailNotification.FailureReason.NONE
        try:
            with transaction.atomic():  # a savepoint: the caller's transaction stays usable
                notification.save(
                    update_fields=[
                        "status",
                        "attempts",
                        "retry_after",
                        "failure_reason",
                        "updated_at",
                    ]
                )
        except IntegrityError as exc:
            constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "")
            reason = _RETRY_BLOCKED.get(constraint or "", f"{exc}".strip())
            raise NotificationNotRetryable(
                f"#{notification_id} could not be retried: {reason}"
            ) from exc
    logger.info(
        "notification %s queued again by an operator",
        notification_id,
        extra={"action": "notification_retry", "notification_id": notification_id},
    )
    return notification


def notifications_expire(*, notification_ids: Sequence[int], now: datetime) -> int:
    """Write `expired` on those rows that are still unanswered and past expires_at (I13).

    A row with an accepted reply is answered, even if it is still `sent` (a reply accepted by
    an older release whose relay has not finished): it is never expired; the relay marks it
    responded. The guard is `_expire_sql()`, shared with review_requests_expire.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH expired AS ({_expire_sql()}) SELECT count(*) FROM expired",
            {"ids": list(notification_ids), "now": now},
        )
        return cursor.fetchone()[0]


@cache  # built from model metadata once per process
def _expire_sql() -> str:
    """The expiry guard, the one place it is written: still `sent`, past expires_at, no
    accepted reply. An UPDATE … RETURNING id, used as a data-modifying CTE."""
    notification = EmailNotification._meta
    reply_fk = notification.get_field("replies").field
    reply_table = reply_fk.model._meta.db_table
    # Identifiers come from model metadata and values from our own constants, never from input.
    return f"""
        UPDATE {notification.db_table} AS e
        SET status = '{Status.EXPIRED}', updated_at = %(now)s
        WHERE e.id = ANY(%(ids)s) AND e.status = '{Status.SENT}' AND e.expires_at <= %(now)s
          AND NOT EXISTS (SELECT 1 FROM {reply_table} AS r WHERE r.{reply_fk.column} = e.id)
        RETURNING e.id
    """


def _log_rung_down(*, user_id: int, from_rung: str, to_rung: str) -> None:
    logger.info(
        "user %s missed %s review requests in a row: rung %s -> %s",
        user_id,
        MISSED_THRESHOLD,
        from_rung,
        to_rung,
        extra={
            "action": "notification_rung_down",
            "user_id": user_id,
            "from_rung": from_rung,
            "to_rung": to_rung,
        },
    )


@dataclass(frozen=True)
class ReviewExpiry:
    """What expiring a user's overdue review requests did."""

    expired: int  # rows written `expired` (each one a miss)
    rung: str | None  # the user's rung afterwards; None when nothing expired (not read)
    stepped_down: bool


def review_requests_expire(
    *, user_id: int, notification_ids: Sequence[int], now: datetime
) -> ReviewExpiry:
    """Expire the user's overdue review requests and count each as a miss on the ladder (I13).

    The guard of notifications_expire (`_expire_sql`) and the ladder (`_ladder_sql`: each miss
    adds one; reaching MISSED_THRESHOLD steps one rung down and resets the count; `paused` is
    the bottom) in one statement, so the sweep's expiry cycle stays within 5 queries per
    user. Runs in the caller's transaction (the user's savepoint).
    """
    return _review_requests_expire_upsert(
        user_id=user_id, notification_ids=notification_ids, now=now
    )


def _ladder_sql(rung: str, count: str, downgraded_at: str) -> tuple[str, str, str]:
    """SQL for the new (rung, consecutive_missed, downgraded_at) from the old rung and count
    expressions, `m.n` misses: the missed-reply ladder (I13), the one place it is written;
    one rung per call."""
    steps = " ".join(f"WHEN '{a}' THEN '{b}'" for a, b in zip(LADDER, LADDER[1:], strict=False))
    step = f"({rung} <> '{Rung.PAUSED}' AND {count} + m.n >= {MISSED_THRESHOLD})"
    return (
        f"CASE WHEN {step} THEN (CASE {rung} {steps} ELSE {rung} END) ELSE {rung} END",
        f"CASE WHEN {step} THEN 0 ELSE {count} + m.n END",
        f"CASE WHEN {step} THEN %(now)s::timestamptz ELSE {downgraded_at} END",
    )


@cache  # built from model metadata once per process
def _expire_upsert_sql() -> str:
    preference = NotificationPreference._meta.db_table
    new_rung, new_count, new_downgraded = _ladder_sql(
        f"'{Rung.IMMEDIATE}'", "0", "NULL::timestamptz"
    )
    upd_rung, upd_count, upd_downgraded = _ladder_sql(
        "p.rung", "p.consecutive_missed", "p.downgraded_at"
    )
    # Identifiers come from model metadata and values from our own constants, never from input.
    return f"""
        WITH expired AS ({_expire_sql()}), m AS (SELECT count(*)::integer AS n FROM expired)
        INSERT INTO {preference} AS p
            (user_id, rung, consecutive_missed, downgraded_at, updated_at)
        SELECT %(user_id)s, {new_rung}, {new_count},
            {new_downgraded}, %(touched)s
        FROM m WHERE m.n > 0
        ON CONFLICT (user_id) DO UPDATE SET
            rung = (SELECT {upd_rung} FROM m),
            consecutive_missed = (SELECT {upd_count} FROM m),
            downgraded_at = (SELECT {upd_downgraded} FROM m),
            updated_at = EXCLUDED.updated_at
        RETURNING p.rung, p.consecutive_missed, (SELECT n FROM m)
    """


def _review_requests_expire_upsert(
    *, user_id: int, notification_ids: Sequence[int], now: datetime
) -> ReviewExpiry:
    """One statement: the guarded expire UPDATE (a data-modifying CTE) feeds the missed count
    into an upsert of the preference. The upsert locks the preference row (two sweeps add
    up) and creates it for a user still on the defaults (a racing insert becomes an update
    instead of an error).

    PostgreSQL < 18 cannot return the old row, so the step-down is read off the new one: a
    step resets the count to 0, while without a step the count grows by the (> 0) misses; the
    old rung is then the one above the new rung (a step never starts from `paused`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _expire_upsert_sql(),
            {
                "ids": list(notification_ids),
                "now": now,
                "user_id": user_id,
                "touched": timezone.now(),
            },
        )
        row = cursor.fetchone()
    if row is None:  # nothing expired: the preference was not touched
        return ReviewExpiry(expired=0, rung=None, stepped_down=False)
    rung, count, expired = row
    stepped_down = count == 0
    if stepped_down:
        _log_rung_down(user_id=user_id, from_rung=LADDER[LADDER.index(rung) - 1], to_rung=rung)
    return ReviewExpiry(expired=expired, rung=rung, stepped_down=stepped_down)


def preference_set_rung(
    *, user_id: int, rung: str, reason: str, now: datetime | None = None
) -> NotificationPreference:
    """Put a user on a rung and clear the missed count (admin restore, unsubscribe)."""
    if rung not in LADDER:
        raise ValueError(f"unknown rung {rung!r}")
    now = now or timezone.now()
    with transaction.atomic():
        NotificationPreference.objects.get_or_create(user_id=user_id)
        preference = NotificationPreference.objects.select_for_update().get(user_id=user_id)
        old_rung = preference.rung
        preference.rung = rung
        preference.consecutive_missed = 0
        preference.downgraded_at = None if rung == Rung.IMMEDIATE else now
        preference.save(update_fields=["rung", "consecutive_missed", "downgraded_at", "updated_at"])
    logger.info(
        "user %s rung %s -> %s (%s)",
        user_id,
        old_rung,
        rung,
        reason,
        extra={
            "action": "notification_rung_set",
            "user_id": user_id,
            "from_rung": old_rung,
            "to_rung": rung,
            "reason": reason,
        },
    )
    return preference


def preference_restore_rung(*, user_id: int) -> NotificationPreference:
    """The admin's "restore rung": back to immediate notifications with a clean count."""
    return preference_set_rung(user_id=user_id, rung=Rung.IMMEDIATE, reason="restored by admin")


def notification_unsubscribe(
    *, token: str, reason: str = "unsubscribed by mail"
) -> NotificationPreference:
    """List-Unsubscribe (the mailto, or the one-click link): pause the user the token was
    sent to (restorable from the admin). Idempotent: a paused user stays paused."""
    user_id = EmailNotification.objects.values_list("user_id", flat=True).get(token=token)
    return preference_set_rung(user_id=user_id, rung=Rung.PAUSED, reason=reason)
