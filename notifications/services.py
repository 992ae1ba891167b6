"""State changes of notifications and preferences. Every write goes through a named function."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from notifications.exceptions import NotificationNotOpen, NotificationNotRetryable
from notifications.models import EmailNotification, NotificationPreference

logger = logging.getLogger(__name__)

Status = EmailNotification.Status
Rung = NotificationPreference.Rung

MISSED_THRESHOLD = 3  # consecutive expired review requests that step a user one rung down
LADDER: tuple[str, ...] = (Rung.IMMEDIATE, Rung.DAILY, Rung.WEEKLY, Rung.PAUSED)
_LAST_ERROR_CHARS = 2000


def next_rung_down(rung: str) -> str:
    index = LADDER.index(rung)
    return LADDER[min(index + 1, len(LADDER) - 1)]


def retry_delay(attempts: int) -> timedelta:
    """Exponential backoff with a cap between send attempts (the sweep cadence adds jitter)."""
    base = settings.NOTIFICATION_RETRY_BASE_SECONDS
    seconds = min(base * 2 ** max(attempts - 1, 0), settings.NOTIFICATION_RETRY_MAX_SECONDS)
    return timedelta(seconds=seconds)


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


def notification_mark_sent(
    *, notification_id: int, message_id: str, sent_at: datetime, expires_at: datetime
) -> bool:
    """Record that the mail service accepted the message (the only way to reach `sent`, I12).

    Accepts a row that is `sending` or was meanwhile handed back to `pending` by the
    reconciler: the mail did leave, so recording it prevents a second copy. Returns False if
    another worker already recorded a send (a duplicate mail went out; logged).
    """
    if not message_id:
        raise ValueError("a sent notification needs the mail service's message id")
    updated = EmailNotification.objects.filter(
        pk=notification_id, status__in=[Status.SENDING, Status.PENDING]
    ).update(
        status=Status.SENT,
        ses_message_id=message_id,
        sent_at=sent_at,
        expires_at=expires_at,
        claimed_at=None,
        retry_after=None,
        last_error="",
        updated_at=sent_at,
    )
    if not updated:
        logger.warning(
            "notification %s was sent again after another worker recorded it",
            notification_id,
            extra={"action": "notification_duplicate_send", "notification_id": notification_id},
        )
    return bool(updated)


def notification_record_send_failure(
    *, notification_id: int, claimed_at: datetime, attempt: int, error: str, now: datetime
) -> str | None:
    """The service refused the message: back to pending with a backoff, or failed when spent.

    Only our own claim is touched (status `sending` with our claimed_at). Returns the new
    status, or None if the claim was no longer ours.
    """
    status = Status.FAILED if attempt >= settings.NOTIFICATION_SEND_MAX_ATTEMPTS else Status.PENDING
    updated = EmailNotification.objects.filter(
        pk=notification_id, status=Status.SENDING, claimed_at=claimed_at
    ).update(
        status=status,
        claimed_at=None,
        retry_after=now + retry_delay(attempt) if status == Status.PENDING else None,
        last_error=error[:_LAST_ERROR_CHARS],
        updated_at=now,
    )
    return status if updated else None


def notification_release_claims(*, claims: Sequence[tuple[int, datetime]], now: datetime) -> int:
    """Hand claims (notification id, our claimed_at) we will not use back to pending, without
    spending an attempt. A claim that is no longer ours is left alone."""
    mine = Q(pk__in=[])
    for notification_id, claimed_at in claims:
        mine |= Q(pk=notification_id, claimed_at=claimed_at)
    return EmailNotification.objects.filter(mine, status=Status.SENDING).update(
        status=Status.PENDING,
        claimed_at=None,
        attempts=F("attempts") - 1,
        updated_at=now,
    )


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
        try:
            with transaction.atomic():  # a savepoint: the caller's transaction stays usable
                notification.save(update_fields=["status", "attempts", "retry_after", "updated_at"])
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


def notification_reconcile_stale_claims(*, kind: str | None, now: datetime) -> int:
    """Rows left `sending` past the claim timeout belong to a crashed worker: back to pending.

    The crashed worker may or may not have handed the mail over, so the next claim may send a
    duplicate; it never loses the notification or leaves it blocked (I12). A row whose
    attempts are spent (it crashed the sender every time) is marked failed instead.
    """
    cutoff = now - timedelta(seconds=settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS)
    stale = EmailNotification.objects.filter(status=Status.SENDING, claimed_at__lt=cutoff)
    if kind is not None:
        stale = stale.filter(kind=kind)
    spent = Q(attempts__gte=settings.NOTIFICATION_SEND_MAX_ATTEMPTS)
    failed = stale.filter(spent).update(
        status=Status.FAILED,
        claimed_at=None,
        last_error="claim timed out on the last attempt (worker crashed while sending?)",
        updated_at=now,
    )
    reclaimed = stale.filter(~spent).update(
        status=Status.PENDING,
        claimed_at=None,
        retry_after=None,
        last_error="claim timed out (worker crashed while sending?)",
        updated_at=now,
    )
    if failed or reclaimed:
        logger.warning(
            "reconciled %s stale notification claims (%s back to pending, %s failed)",
            failed + reclaimed,
            reclaimed,
            failed,
            extra={"action": "notification_claims_reconciled", "kind": kind},
        )
    return failed + reclaimed


def notifications_expire(*, notification_ids: Sequence[int], now: datetime) -> int:
    """Write `expired` on those rows that are still unanswered and past expires_at (I13).

    A row with an accepted reply is answered, even if it is still `sent` (a reply accepted by
    an older release whose relay has not finished): it is never expired; the relay marks it
    responded.
    """
    return (
        EmailNotification.objects.filter(
            pk__in=notification_ids, status=Status.SENT, expires_at__lte=now
        )
        .filter(replies__isnull=True)
        .update(status=Status.EXPIRED, updated_at=now)
    )


def preference_record_missed(
    *, user_id: int, missed: int, now: datetime
) -> tuple[NotificationPreference, bool]:
    """Count `missed` unanswered review requests; at MISSED_THRESHOLD step one rung down.

    Returns the preference and whether it stepped down. The row is locked so two sweeps
    counting for the same user add up instead of overwriting each other.
    """
    preference = NotificationPreference.objects.select_for_update().filter(user_id=user_id).first()
    if preference is None:  # first miss of a user on the defaults: inserted below (a racing
        # insert fails the caller's savepoint, and the expiry is simply retried next cycle)
        preference = NotificationPreference(user_id=user_id)
    preference.consecutive_missed += missed
    stepped_down = False
    if preference.consecutive_missed >= MISSED_THRESHOLD and preference.rung != Rung.PAUSED:
        old_rung = preference.rung
        preference.rung = next_rung_down(old_rung)
        preference.consecutive_missed = 0
        preference.downgraded_at = now
        stepped_down = True
        logger.info(
            "user %s missed %s review requests in a row: rung %s -> %s",
            user_id,
            MISSED_THRESHOLD,
            old_rung,
            preference.rung,
            extra={
                "action": "notification_rung_down",
                "user_id": user_id,
                "from_rung": old_rung,
                "to_rung": preference.rung,
            },
        )
    if preference.pk is None:
        preference.save()
    else:
        preference.save(update_fields=["consecutive_missed", "rung", "downgraded_at", "updated_at"])
    return preference, stepped_down


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


def notification_unsubscribe(*, token: str) -> NotificationPreference:
    """List-Unsubscribe: pause the user the token was sent to (restorable from the admin)."""
    user_id = EmailNotification.objects.values_list("user_id", flat=True).get(token=token)
    return preference_set_rung(user_id=user_id, rung=Rung.PAUSED, reason="unsubscribed by mail")
