"""A word back to the PI (issue 13): a notice that their reply was not acted on, and why.

Two halves, the same shape as a sweep (I12, no phantom sends, nothing lost):

* `notice_reply_rejected` creates the notice as a `pending` EmailNotification of kind
  `reply_rejected`, in the caller's transaction: the inbound intake calls it in the same
  transaction that records the rejection, so a rejection that rolls back leaves no notice and
  a committed one always has its notice (or the reason it has none). At most one notice per
  answered notification per hour (`NOTICE_INTERVAL`); the caller holds that notification's row
  lock, so two pollers cannot both pass the cap.
* `notices_send` is the sender path: stale claims reconciled, due rows **claimed** (`sending`,
  claimed_at, attempts + 1) and **committed**, then **sent** (`sweep_delivery.deliver_batch`)
  and the outcome **recorded** (`sent` with the message id, or back to `pending` with a
  backoff / `failed`). A crash between claim and record leaves the row `sending`, and the next
  run's reconciler hands it back after NOTIFICATION_CLAIM_TIMEOUT_SECONDS.

A notice goes only to the address the answered notification went to (`to_address`), never to
the From of the mail; its Reply-To and List-Unsubscribe are those of the answered
notification, so "reply again" reaches the same token and "unsubscribe" still works. A notice
takes no replies itself: it is sent already expired (`sweep_delivery._expiry_window`).
Which rejections deserve a notice is the inbound app's call (`inbound_email.services.notices`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from notifications import sending
from notifications.emails import Delivery
from notifications.models import EmailNotification
from notifications.pacing import Pacer
from notifications.senders import get_sender
from notifications.senders.base import EmailSender
from notifications.suppression import notifications_suppress_pending
from notifications.sweep_delivery import deliver_batch
from notifications.sweep_plan import Clock

logger = logging.getLogger(__name__)

Kind = EmailNotification.Kind
Status = EmailNotification.Status

NOTICE_INTERVAL = timedelta(hours=1)  # at most one notice per answered notification per hour
SEND_BATCH = 100  # notices claimed per transaction


def notice_reply_rejected(
    *, about: EmailNotification, reason: str, now: datetime
) -> EmailNotification | None:
    """A pending notice to `about.to_address` that a reply to `about` was rejected for
    `reason`; None when one was already created for `about` in the last hour (or `about` has
    no address). Call it holding `about`'s row lock, in the transaction of the rejection."""
    if not about.to_address:
        return None
    recent = EmailNotification.objects.filter(
        kind=Kind.REPLY_REJECTED, about=about, created_at__gt=now - NOTICE_INTERVAL
    )
    if recent.exists():
        logger.info(
            "no rejection notice for notification %s: one was created within the hour",
            about.pk,
            extra={"action": "notice_capped", "notification_id": about.pk, "reason": reason},
        )
        return None
    notice = EmailNotification.objects.create(
        user_id=about.user_id,
        kind=Kind.REPLY_REJECTED,
        proposal_id=about.proposal_id,
        about=about,
        notice_reason=reason[:30],
        to_address=about.to_address,
        status=Status.PENDING,
    )
    logger.info(
        "rejection notice %s queued for notification %s (%s)",
        notice.pk,
        about.pk,
        reason,
        extra={"action": "notice_queued", "notification_id": about.pk, "reason": reason},
    )
    return notice


@dataclass
class NoticeSummary:
    sweep: str = Kind.REPLY_REJECTED.value  # the key the schedule's result is read by
    sent: int = 0
    failed: int = 0  # sends refused (retried later, or failed for good)
    errors: int = 0  # deliveries that raised; the row stays `sending` for the reconciler
    reconciled: int = 0  # stale `sending` claims handed back
    released: int = 0  # claims handed back unused (out of claim time, or refused for the rate)
    throttled: int = 0  # sends refused for the rate and tried again (no attempt spent)
    held: int = 0  # claims handed back unspent: sending paused (daily quota)
    suppressed: int = 0  # pending notices to a suppressed address, recorded `suppressed`

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _claim(*, now: datetime, limit: int) -> list[Delivery]:
    """Claim due pending notices (SKIP LOCKED: another worker's claims are left alone)."""
    rows = list(
        EmailNotification.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(kind=Kind.REPLY_REJECTED, status=Status.PENDING)
        .filter(Q(retry_after__isnull=True) | Q(retry_after__lte=now))
        .select_related("user", "proposal", "about")
        .order_by("pk")[:limit]
    )
    if not rows:
        return []
    EmailNotification.objects.filter(pk__in=[r.pk for r in rows]).update(
        status=Status.SENDING, claimed_at=now, attempts=F("attempts") + 1, updated_at=now
    )
    return [
        Delivery(
            notification_id=row.pk,
            kind=Kind.REPLY_REJECTED,
            # The answered notification's token: Reply-To and List-Unsubscribe are its own.
            token=row.about.token if row.about is not None else row.token,
            to_address=row.to_address,
            user_id=row.user_id,
            recipient_name=row.user.get_full_name() or row.user.get_username(),
            claimed_at=now,
            attempt=row.attempts + 1,
            proposal_title=row.proposal.title if row.proposal is not None else "",
            notice_reason=row.notice_reason,
        )
        for row in rows
    ]


def notices_send(
    *, now: datetime | None = None, sender: EmailSender | None = None, batch_size: int = SEND_BATCH
) -> NoticeSummary:
    """Send the pending rejection notices: claim -> commit -> send -> record. Call it outside
    any transaction (the claims must commit before the mail leaves)."""
    clock = Clock(now)
    sender = sender or get_sender()
    summary = NoticeSummary()
    summary.reconciled = sending.notification_reconcile_stale_claims(
        kind=Kind.REPLY_REJECTED, now=clock.now()
    )
    # A notice to an address that bounced or complained is never sent (issue 23).
    summary.suppressed = notifications_suppress_pending(now=clock.now(), kind=Kind.REPLY_REJECTED)
    pacer = Pacer(sender)
    while pacer.hold_until(clock.now()) is None:  # paused (daily quota): the notices wait
        claimed_since = time.monotonic()
        with transaction.atomic():
            deliveries = _claim(now=clock.now(), limit=batch_size)
        if not deliveries:
            break
        # The claims are committed: only now may mail leave (I12).
        deliver_batch(deliveries, sender, clock, summary, claimed_since=claimed_since, pacer=pacer)
        if len(deliveries) < batch_size or summary.released or summary.held:
            break  # a slow mail service: what was handed back waits for the next run
    if summary.sent or summary.failed or summary.errors or summary.reconciled:
        logger.info(
            "rejection notices: %s sent, %s failed, %s errors, %s reconciled",
            summary.sent,
            summary.failed,
            summary.errors,
            summary.reconciled,
            extra={"action": "notices_sent", **summary.as_dict()},
        )
    return summary
