"""The claim/send path's state changes: what a sweep writes around each hand-over to the mail
service (sent with its message id, refused with a backoff, claims handed back) and the
reconciler of claims a crashed worker left `sending` (I12).

The claims themselves are taken in the sweep's planning step (sweep_plan.py); the ladder,
replies and operator actions are in services.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import F, Q

from notifications.conf import get_config
from notifications.models import EmailNotification
from notifications.selectors import notifications_stuck_sending
from project.backoff import retry_delay as backoff_delay

logger = logging.getLogger(__name__)

Status = EmailNotification.Status
FailureReason = EmailNotification.FailureReason
_LAST_ERROR_CHARS = 2000


def retry_delay(attempts: int) -> timedelta:
    """Exponential backoff with a cap between send attempts (the sweep cadence adds jitter)."""
    config = get_config()
    seconds = backoff_delay(
        attempts, base=config.retry_base_seconds, cap=config.retry_max_seconds, jitter=0
    )
    return timedelta(seconds=seconds)


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
    status = Status.FAILED if attempt >= get_config().send_max_attempts else Status.PENDING
    updated = EmailNotification.objects.filter(
        pk=notification_id, status=Status.SENDING, claimed_at=claimed_at
    ).update(
        status=status,
        claimed_at=None,
        retry_after=now + retry_delay(attempt) if status == Status.PENDING else None,
        last_error=error[:_LAST_ERROR_CHARS],
        failure_reason=FailureReason.SEND_REFUSED if status == Status.FAILED else "",
        updated_at=now,
    )
    return status if updated else None


def notifications_fail_invalid_address(
    *,
    user_id: int,
    kind: str,
    pending_ids: Sequence[int],
    proposal_ids: Sequence[int | None],
    problem: str,
    now: datetime,
) -> int:
    """The user's address cannot be a recipient: what the sweep would claim now fails at once.

    Pending rows and the rows the sweep would create (one per proposal, None for a digest)
    go straight to `failed` with reason invalid_address, never `sending`: a CR/LF in the
    address made Django raise BadHeaderError, which left the row `sending` for the claim
    timeout five times over with a last error that blamed a crash. The address itself is not
    stored (it is what is wrong); the user's row in the admin shows it. Returns how many rows.
    """
    error = f"invalid_address: {problem}"
    failed = EmailNotification.objects.filter(pk__in=pending_ids, status=Status.PENDING).update(
        status=Status.FAILED,
        failure_reason=FailureReason.INVALID_ADDRESS,
        last_error=error,
        claimed_at=None,
        retry_after=None,
        updated_at=now,
    )
    created = EmailNotification.objects.bulk_create(
        [
            EmailNotification(
                user_id=user_id,
                kind=kind,
                proposal_id=proposal_id,
                to_address="",
                status=Status.FAILED,
                failure_reason=FailureReason.INVALID_ADDRESS,
                last_error=error,
            )
            for proposal_id in proposal_ids
        ]
    )
    if failed or created:
        logger.warning(
            "%s notification(s) of user %s failed: invalid address (%s)",
            failed + len(created),
            user_id,
            problem,
            extra={"action": "notification_invalid_address", "user_id": user_id, "kind": kind},
        )
    return failed + len(created)


def notification_release_claims(
    *,
    claims: Sequence[tuple[int, datetime]],
    now: datetime,
    retry_after: datetime | None = None,
    reason: str = "",
) -> int:
    """Hand claims (notification id, our claimed_at) we will not use back to pending, without
    spending an attempt. A claim that is no longer ours is left alone.

    `retry_after` keeps them from being claimed before then (a rate refusal: a second; the
    daily quota: the end of the pause); `reason` is shown as the row's last error.
    """
    mine = Q(pk__in=[])
    for notification_id, claimed_at in claims:
        mine |= Q(pk=notification_id, claimed_at=claimed_at)
    changes: dict[str, object] = {}
    if retry_after is not None:
        changes["retry_after"] = retry_after
    if reason:
        changes["last_error"] = reason[:_LAST_ERROR_CHARS]
    return EmailNotification.objects.filter(mine, status=Status.SENDING).update(
        status=Status.PENDING,
        claimed_at=None,
        attempts=F("attempts") - 1,
        updated_at=now,
        **changes,
    )


def notification_reconcile_stale_claims(*, kind: str | None, now: datetime) -> int:
    """Rows left `sending` past the claim timeout belong to a crashed worker: back to pending.

    The crashed worker may or may not have handed the mail over, so the next claim may send a
    duplicate; it never loses the notification or leaves it blocked (I12). A row whose
    attempts are spent (it crashed the sender every time) is marked failed instead.
    """
    config = get_config()
    stale = notifications_stuck_sending(now=now)
    if kind is not None:
        stale = stale.filter(kind=kind)
    spent = Q(attempts__gte=config.send_max_attempts)
    failed = stale.filter(spent).update(
        status=Status.FAILED,
        claimed_at=None,
        last_error="claim timed out on the last attempt (worker crashed while sending?)",
        failure_reason=FailureReason.CLAIM_TIMED_OUT,
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
