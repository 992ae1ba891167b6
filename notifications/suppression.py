"""The suppression list: addresses that bounced hard, complained, or bounced softly three
times in 7 days, and are no longer mailed (issue 23.2).

Reports come from two doors, both of which only call `feedback_record`:
* inbound mail (`inbound_email/delivery_reports.py`): RFC 3464 DSNs and RFC 5965 ARF reports
  that reach the inbound address, recognised before reply parsing;
* SES event notifications through SNS (`notifications/ses_events.py`).

Rules: a hard bounce or a complaint suppresses the address for good; a third soft bounce
within 7 days suppresses it for 7 days. The sweeps read the list when they load a batch
(`selectors.sweep_user_batch`'s `is_suppressed`) and record due mail to a suppressed address
as `suppressed`, never sent. An operator lifts a suppression in the admin (permission
`notifications.unsuppress`, logged), or adds one by hand (`suppression_add`, permission
`notifications.add_suppression`, logged with who did it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Lower

from notifications.exceptions import AlreadySuppressed
from notifications.models import DeliveryFeedback, EmailNotification, Suppression
from project.redaction import redact_address

logger = logging.getLogger(__name__)

Kind = DeliveryFeedback.Kind
Reason = Suppression.Reason

SOFT_BOUNCE_LIMIT = 3  # soft bounces ...
SOFT_BOUNCE_WINDOW = timedelta(days=7)  # ... within this window suppress ...
SOFT_SUPPRESSION = timedelta(days=7)  # ... for this long
_REPORT_CHARS = 4000


def normalise(address: str) -> str:
    return address.strip().strip("<>").strip().lower()


def active_suppressions(*, now: datetime) -> QuerySet[Suppression]:
    return Suppression.objects.filter(lifted_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )


_EVENT_CONSTRAINT = "delivery_feedback_one_per_event"


def feedback_event_key(*, message_id: str, address: str, kind: str) -> str:
    """What one report is about, whichever door it came through: the kind, the recipient and
    the bounced message (SES's message id, as SNS events name it and as the notification row
    stores it: `EmailNotification.ses_message_id`)."""
    return f"{kind}|{normalise(address)}|{message_id}"[:600]


def address_is_suppressed(address: str, *, now: datetime) -> bool:
    return active_suppressions(now=now).filter(address=normalise(address)).exists()


@dataclass(frozen=True)
class FeedbackOutcome:
    feedback: DeliveryFeedback
    suppression: Suppression | None  # set when this report suppressed the address


def feedback_record(
    *,
    address: str,
    kind: str,
    source: str,
    report: str,
    now: datetime,
    event_key: str | None = None,
) -> FeedbackOutcome | None:
    """Record one bounce or complaint and apply the rules; None when a report with the same
    `event_key` (feedback_event_key) is already recorded. Both doors (SNS events, inbound
    reports) pass the key; None records without one (nothing to deduplicate against). Call
    it in the caller's transaction (the inbound intake's, so a rolled-back mail leaves no
    feedback behind).

    The key is claimed by the insert itself (a unique constraint, in a savepoint): a
    concurrent insert of the same key waits for the first transaction and then fails, so no
    interleaving records one event twice (a look-then-insert did, issue 28.2)."""
    address = normalise(address)
    if not address or "@" not in address:
        raise ValueError(f"a feedback report needs a recipient address, not {address!r}")
    with transaction.atomic():
        _lock_address(address)
        return _record_and_apply(
            address=address, kind=kind, source=source, report=report, now=now, event_key=event_key
        )


def _lock_address(address: str) -> None:
    """Reports about one address are counted one at a time: the soft-bounce rule counts the
    reports committed before it, and three different soft bounces arriving together each
    counted only the others that had committed before their own transaction began, so none
    saw three. A transaction-level advisory lock (released at commit, so safe behind
    PgBouncer's transaction pooling) makes each wait for the one before."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"suppression:{address}"]
        )


def _record_and_apply(
    *, address: str, kind: str, source: str, report: str, now: datetime, event_key: str | None
) -> FeedbackOutcome | None:
    try:
        with transaction.atomic():
            feedback = DeliveryFeedback.objects.create(
                address=address,
                kind=kind,
                source=source,
                report=report[:_REPORT_CHARS],
                occurred_at=now,
                event_key=event_key,
            )
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "") != (
            _EVENT_CONSTRAINT
        ):
            raise
        logger.info(
            "%s for %s already recorded (%s): not counted again",
            kind,
            redact_address(address),
            source,
            extra={"action": "delivery_feedback_duplicate", "kind": kind, "source": source},
        )
        return None
    suppression = None
    if kind in (Kind.HARD_BOUNCE, Kind.COMPLAINT):
        reason = Reason.HARD_BOUNCE if kind == Kind.HARD_BOUNCE else Reason.COMPLAINT
        suppression = _suppress(address, reason, report, now, expires_at=None)
    elif kind == Kind.SOFT_BOUNCE:
        recent = DeliveryFeedback.objects.filter(
            address=address, kind=Kind.SOFT_BOUNCE, occurred_at__gt=now - SOFT_BOUNCE_WINDOW
        ).count()
        if recent >= SOFT_BOUNCE_LIMIT and not address_is_suppressed(address, now=now):
            suppression = _suppress(
                address, Reason.SOFT_BOUNCES, report, now, expires_at=now + SOFT_SUPPRESSION
            )
    logger.info(
        "%s for %s recorded (%s)%s",
        kind,
        redact_address(address),
        source,
        "; address suppressed" if suppression else "",
        extra={"action": "delivery_feedback", "kind": kind, "source": source},
    )
    return FeedbackOutcome(feedback=feedback, suppression=suppression)


def _suppress(
    address: str, reason: str, report: str, now: datetime, *, expires_at: datetime | None
) -> Suppression:
    """Suppress `address` (a permanent suppression is never shortened by a soft one)."""
    current = Suppression.objects.select_for_update().filter(address=address).first()
    if current is not None and current.lifted_at is None and current.expires_at is None:
        if expires_at is not None:
            return current  # already suppressed for good
    suppression, _ = Suppression.objects.update_or_create(
        address=address,
        defaults={
            "reason": reason,
            "source_report": report[:_REPORT_CHARS],
            "suppressed_at": now,
            "expires_at": expires_at,
            "lifted_at": None,
            "lifted_by": "",
            "suppressed_by": "",
        },
    )
    logger.warning(
        "%s suppressed: %s",
        redact_address(address),
        reason,
        extra={"action": "address_suppressed", "reason": reason},
    )
    return suppression


def suppression_add(*, address: str, note: str, by: str, now: datetime) -> Suppression:
    """An operator suppresses an address by hand (a PI asked by phone, a mailbox known dead):
    for good, until lifted. An address suppressed already is refused, so the record of the
    report that suppressed it is kept; a lifted or expired one is suppressed again. Under the
    address's lock, as the reports are counted, so a report arriving at the same moment is
    applied before or after it, never half-way."""
    address = normalise(address)
    with transaction.atomic():
        _lock_address(address)
        if active_suppressions(now=now).filter(address=address).exists():
            raise AlreadySuppressed(f"{address} is already suppressed")
        suppression, _ = Suppression.objects.update_or_create(
            address=address,
            defaults={
                "reason": Reason.MANUAL,
                "source_report": note[:_REPORT_CHARS],
                "suppressed_at": now,
                "expires_at": None,
                "lifted_at": None,
                "lifted_by": "",
                "suppressed_by": by[:150],
            },
        )
    logger.warning(
        "%s suppressed by hand by %s",
        redact_address(address),
        by,
        extra={"action": "address_suppressed", "reason": Reason.MANUAL, "user": by},
    )
    return suppression


def suppression_lift(*, suppression: Suppression, by: str, now: datetime) -> bool:
    """Mail the address again (an operator's decision; the admin logs it). False when it was
    not active."""
    lifted = (
        active_suppressions(now=now)
        .filter(pk=suppression.pk)
        .update(lifted_at=now, lifted_by=by[:150])
    )
    if lifted:
        logger.warning(
            "suppression of %s lifted by %s",
            redact_address(suppression.address),
            by,
            extra={"action": "suppression_lifted", "user": by},
        )
    return bool(lifted)


def notifications_suppress_pending(*, now: datetime, kind: str | None = None) -> int:
    """Pending rows addressed to a suppressed address end `suppressed` (never sent)."""
    rows = EmailNotification.objects.annotate(lower_to=Lower("to_address")).filter(
        status=EmailNotification.Status.PENDING,
        lower_to__in=active_suppressions(now=now).values("address"),
    )
    if kind is not None:
        rows = rows.filter(kind=kind)
    return EmailNotification.objects.filter(pk__in=rows.values("pk")).update(
        status=EmailNotification.Status.SUPPRESSED,
        claimed_at=None,
        retry_after=None,
        last_error="the address is suppressed (bounced or complained)",
        updated_at=now,
    )
