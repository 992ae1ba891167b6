"""The delivery half of a sweep cycle: hand each claimed row to the sender, after the claims
committed (I12), at the account's pace (notifications/pacing.py).

Each send first waits for its slot of the shared token bucket. Accepted -> `sent` with the
message id; refused (SendError) -> back to `pending` with a backoff, or `failed` when its
attempts are spent. Refused for the rate (SendThrottled) -> no attempt spent: a short wait
and a new slot, a few times, then the claim goes back to `pending` for the next cycle.
Refused for the daily quota (SendQuotaExceeded) -> all sending pauses and this claim and the
rest of the batch go back to `pending` unspent, due when the pause ends. Claims the cycle has
no time left for are handed back before another worker's reconciler would take them as
crashed. A crash anywhere here leaves rows `sending`; the next cycle's reconciler hands them
back to pending.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Protocol

from django.db import DatabaseError

from notifications import sending
from notifications.conf import get_config
from notifications.emails import Delivery, render_notification_email
from notifications.models import EmailNotification
from notifications.pacing import Pacer
from notifications.senders.base import (
    EmailSender,
    MessageId,
    OutgoingEmail,
    SendError,
    SendQuotaExceeded,
    SendThrottled,
)
from notifications.sweep_plan import Clock
from project.reconnect import connection_lost, discard_broken_connection

logger = logging.getLogger(__name__)

Kind = EmailNotification.Kind

THROTTLE_TRIES = 5  # sends refused for the rate before the claim goes back to pending


class DeliveryCounts(Protocol):
    """The counters delivery adds to (a SweepSummary)."""

    sent: int
    failed: int
    errors: int
    released: int
    throttled: int  # sends refused for the rate (no attempt spent)
    held: int  # claims handed back unspent because sending paused (daily quota)


def _expiry_window(kind: str) -> timedelta:
    config = get_config()
    if kind == Kind.REPLY_REJECTED:
        # A notice takes no replies (its Reply-To is the answered notification's): it is sent
        # already expired, so its own token is never open.
        return timedelta(0)
    if kind == Kind.PROPOSAL_REVIEW:
        return timedelta(hours=config.review_expiry_hours)
    return timedelta(hours=config.reply_window_hours)


def _send_paced(
    email: OutgoingEmail, sender: EmailSender, pacer: Pacer, summary: DeliveryCounts
) -> MessageId:
    """Send in this process's next slot; a rate refusal waits and takes another (no attempt).
    SendThrottled when the rate refused every try."""
    for _ in range(THROTTLE_TRIES):
        pacer.wait_for_slot()
        if pacer.quota_spent:  # GetSendQuota says SES would refuse: no call
            raise SendQuotaExceeded(pacer.quota_spent)
        try:
            return sender.send(email)
        except SendThrottled:
            summary.throttled += 1
            time.sleep(get_config().throttle_retry_seconds)
    raise SendThrottled(f"refused for the sending rate {THROTTLE_TRIES} times in a row")


def _deliver(
    delivery: Delivery, sender: EmailSender, pacer: Pacer, clock: Clock, summary: DeliveryCounts
) -> None:
    expires_at = clock.now() + _expiry_window(delivery.kind)
    email = render_notification_email(delivery, expires_at=expires_at)
    try:
        message_id = _send_paced(email, sender, pacer, summary)
    except SendQuotaExceeded:
        raise  # the batch pauses (deliver_batch)
    except SendThrottled as exc:
        now = clock.now()
        summary.released += sending.notification_release_claims(
            claims=[(delivery.notification_id, delivery.claimed_at)],
            now=now,
            retry_after=now + timedelta(seconds=get_config().throttle_retry_seconds),
            reason=str(exc),
        )
        logger.warning(
            "%s sweep: notification %s refused for the sending rate; back to pending, no "
            "attempt spent",
            delivery.kind,
            delivery.notification_id,
            extra={
                "action": "notification_send_throttled",
                "sweep": delivery.kind,
                "notification_id": delivery.notification_id,
            },
        )
        return
    except SendError as exc:
        status = sending.notification_record_send_failure(
            notification_id=delivery.notification_id,
            claimed_at=delivery.claimed_at,
            attempt=delivery.attempt,
            error=str(exc),
            now=clock.now(),
        )
        summary.failed += 1
        logger.warning(
            "%s sweep: send of notification %s to user %s refused (attempt %s, now %s): %s",
            delivery.kind,
            delivery.notification_id,
            delivery.user_id,
            delivery.attempt,
            status,
            exc,
            extra={
                "action": "notification_send_failed",
                "sweep": delivery.kind,
                "user_id": delivery.user_id,
                "notification_id": delivery.notification_id,
                "attempt": delivery.attempt,
            },
        )
        return
    record = {
        "notification_id": delivery.notification_id,
        "message_id": message_id,
        "sent_at": clock.now(),
        "expires_at": expires_at,
    }
    try:
        sending.notification_mark_sent(**record)
    except DatabaseError as exc:
        if not connection_lost(exc):
            raise
        # The mail has left: record it on a fresh connection rather than leave the row
        # `sending` for the reconciler, which would mail it again.
        discard_broken_connection()
        sending.notification_mark_sent(**record)
    summary.sent += 1


def _hold(
    rest: list[Delivery], error: SendError, pacer: Pacer, clock: Clock, summary: DeliveryCounts
) -> None:
    """The daily quota is spent: pause all sending; hand `rest` back unspent until it ends."""
    now = clock.now()
    until = pacer.quota_refused(error, now)
    held = sending.notification_release_claims(
        claims=[(d.notification_id, d.claimed_at) for d in rest],
        now=now,
        retry_after=until,
        reason=f"waiting for the daily quota: {error}",
    )
    summary.held += held
    logger.warning(
        "%s sweep: daily quota spent, %s claims wait until %s",
        rest[0].kind,
        held,
        until.isoformat(),
        extra={"action": "notification_sending_held", "sweep": rest[0].kind},
    )


def deliver_batch(
    deliveries: list[Delivery],
    sender: EmailSender,
    clock: Clock,
    summary: DeliveryCounts,
    *,
    claimed_since: float,
    pacer: Pacer | None = None,
) -> None:
    """Send the batch's claimed rows; `claimed_since` is the monotonic time the claims began."""
    claim_budget = get_config().claim_timeout_seconds / 2
    pacer = pacer or Pacer(sender)
    for index, delivery in enumerate(deliveries):
        if time.monotonic() - claimed_since > claim_budget:
            # Slow mail service: hand the rest back before the reconciler of another worker
            # takes them as crashed (which would risk duplicates).
            rest = deliveries[index:]
            summary.released += sending.notification_release_claims(
                claims=[(d.notification_id, d.claimed_at) for d in rest], now=clock.now()
            )
            logger.warning(
                "%s sweep: delivery ran out of claim time, %s claims handed back",
                delivery.kind,
                len(rest),
                extra={"action": "notification_claims_released", "sweep": delivery.kind},
            )
            return
        try:
            _deliver(delivery, sender, pacer, clock, summary)
        except SendQuotaExceeded as exc:
            _hold(deliveries[index:], exc, pacer, clock, summary)
            return
        except Exception as exc:  # noqa: BLE001 - one row's failure must not stop the others; the row stays `sending` and the reconciler returns it to pending
            if connection_lost(exc):
                # The database is gone: mail sent now could not be recorded and would go
                # out twice. Stop; the rest stay claimed, unsent, for the reconciler.
                raise
            summary.errors += 1
            logger.exception(
                "%s sweep: delivery of notification %s to user %s failed",
                delivery.kind,
                delivery.notification_id,
                delivery.user_id,
                extra={
                    "action": "notification_delivery_error",
                    "sweep": delivery.kind,
                    "user_id": delivery.user_id,
                    "notification_id": delivery.notification_id,
                },
            )
