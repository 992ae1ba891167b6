"""Writes of a ledger row's outcome, shared by the intake (a mail handled) and the relay (an
instruction delivered): finish, reject, quarantine, and "this reply now counts"."""

from __future__ import annotations

import logging
import traceback
from datetime import datetime, timedelta

from django.db import InterfaceError, OperationalError

from inbound_email.conf import get_config
from inbound_email.exceptions import MailLimitExceeded, StoreError
from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import raw_preview
from inbound_email.services.attachments import reply_raw_must_be_kept
from inbound_email.stores import sha256_hex
from notifications.exceptions import NotificationNotOpen
from notifications.models import EmailNotification
from notifications.services import notification_mark_responded
from project.backoff import retry_delay

logger = logging.getLogger(__name__)

Status = InboundEmail.Status
Reason = InboundEmail.Reason


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """The shared exponential backoff (project/backoff.py: capped, with up to 20 % jitter),
    on mail's own base and cap settings."""
    return retry_delay(attempt, base=base, cap=cap, jitter=0.2)


def mail_finish(
    row: InboundEmail,
    status: str,
    reason: str,
    detail: str,
    now: datetime,
    *,
    keep_raw: bool = False,
) -> None:
    """A terminal outcome; processed and discarded mail drop their raw bytes (the admin keeps
    them only for mail an operator may still want to read or reprocess), unless `keep_raw`:
    content of the mail was not fully handled (an attachment kept only in the raw); rejected
    mail keeps its headers and the first bytes of its raw source (`mail_cut_raw`)."""
    row.status = status
    row.reason = reason
    row.detail = detail[:2000]
    row.finished_at = now
    row.next_attempt_at = None
    if status in (Status.PROCESSED, Status.DISCARDED) and not keep_raw:
        row.raw = None
    elif status == Status.REJECTED:
        mail_cut_raw(row)
    row.save()


def mail_cut_raw(row: InboundEmail) -> None:
    """Keep a rejected mail's decoded headers and at most the first
    `INBOUND_EMAIL_REJECTED_RAW_BYTES` (64 KiB) of its raw source; the rest is dropped now,
    not at the retention's end (issue 21: junk kept up to 10 MiB each before). `size` stays
    the mail's full size, so the cut shows (`raw_is_cut`) and a cut mail is never
    reprocessed from its first bytes. The body text shown in the admin is cut to the same."""
    keep = get_config().kept_raw_bytes
    if row.raw is not None and len(row.raw) > keep:
        row.raw = bytes(row.raw[:keep])
        logger.info(
            "mail #%s: raw source cut to its first %s of %s bytes (rejected)",
            row.pk,
            keep,
            row.size,
            extra={"action": "mail_raw_cut", "mail_key": row.store_key},
        )
    row.body_text = row.body_text[:keep]


def raw_is_cut(row: InboundEmail) -> bool:
    """The row keeps only the first bytes of its raw source (a rejected mail, issue 21)."""
    return row.raw is not None and len(row.raw) < row.size


def mail_reject(row: InboundEmail, reason: str, detail: str, now: datetime) -> None:
    mail_finish(row, Status.REJECTED, reason, detail, now)
    logger.info(
        "mail #%s rejected: %s (%s)",
        row.pk,
        reason,
        detail,
        extra={"action": "mail_rejected", "mail_key": row.store_key, "reason": str(reason)},
    )


def mail_set_quarantined(row: InboundEmail, *, reason: str, detail: str, now: datetime) -> None:
    """Quarantined in the ledger; the store copy follows after commit (`store_sync`)."""
    mail_finish(row, Status.QUARANTINED, reason, detail, now)
    logger.warning(
        "mail #%s quarantined: %s (%s)",
        row.pk,
        reason,
        detail,
        extra={"action": "mail_quarantined", "mail_key": row.store_key, "reason": str(reason)},
    )


def _count_answer(reply: Reply, now: datetime) -> None:
    """Mark the notification responded (resets the missed count) unless it already is.

    A notification that is no longer open (expired meanwhile) is logged, never skipped
    silently; whether it is open is the notifications app's call (`NotificationNotOpen`).
    """
    status = (
        EmailNotification.objects.filter(pk=reply.notification_id)
        .values_list("status", flat=True)
        .first()
    )
    if status == EmailNotification.Status.RESPONDED:
        return
    try:
        notification_mark_responded(notification_id=reply.notification_id, responded_at=now)
    except NotificationNotOpen as exc:
        logger.warning(
            "reply %s was accepted but could not count as the answer: %s",
            reply.pk,
            exc,
            extra={
                "action": "reply_late",
                "reply_id": reply.pk,
                "notification_id": reply.notification_id,
            },
        )


def reply_complete(reply: Reply, row: InboundEmail, now: datetime) -> None:
    """The reply is handled durably (at once for a rating, after the relay for an
    instruction): it counts as the answer and its mail is processed (and leaves the intake
    after commit)."""
    if reply.relay_status != Reply.RelayStatus.NONE:
        reply.relayed_at = now
        reply.save()
    _count_answer(reply, now)
    keep_raw = reply_raw_must_be_kept(reply)
    mail_finish(
        row,
        Status.PROCESSED,
        Reason.NONE,
        "raw source kept: an attachment was not stored or not relayed (see the reply)"
        if keep_raw
        else "",
        now,
        keep_raw=keep_raw,
    )


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, StoreError):
        return exc.transient
    return isinstance(exc, OperationalError | InterfaceError | TimeoutError | ConnectionError)


def mail_record_failure(
    row: InboundEmail, exc: BaseException, now: datetime, *, raw: bytes | None = None
) -> None:
    """Count an attempt's error on the row: retry a transient one after the backoff,
    quarantine anything else (a parse limit with the limit as its reason)."""
    config = get_config()
    row.last_error = "".join(traceback.format_exception(exc))[-20_000:]
    transient = _is_transient(exc)
    if raw is not None and not transient:
        # What the admin shows of a quarantined mail, without the parser that may have failed.
        row.raw, row.size, row.sha256 = raw, len(raw), sha256_hex(raw)
        row.headers_text, row.body_text = raw_preview(raw)
    if transient and row.attempts < config.max_attempts:
        delay = backoff_seconds(
            row.attempts, base=config.retry_base_seconds, cap=config.retry_cap_seconds
        )
        row.next_attempt_at = now + timedelta(seconds=delay)
        row.save(update_fields=["last_error", "next_attempt_at", "updated_at"])
        logger.warning(
            "mail #%s failed (attempt %s, retry in %.0fs): %s",
            row.pk,
            row.attempts,
            delay,
            exc,
            extra={"action": "mail_retry", "mail_key": row.store_key, "attempt": row.attempts},
        )
        return
    if isinstance(exc, MailLimitExceeded):  # hostile or absurd mail: the limit is the reason
        mail_set_quarantined(row, reason=Reason(exc.reason), detail=str(exc), now=now)
        return
    reason = Reason.TOO_MANY_ATTEMPTS if transient else Reason.PERMANENT_ERROR
    mail_set_quarantined(row, reason=reason, detail=f"{type(exc).__name__}: {exc}"[:2000], now=now)
    logger.error(
        "mail #%s quarantined after error: %s",
        row.pk,
        exc,
        exc_info=exc,
        extra={"action": "mail_failed", "mail_key": row.store_key, "attempt": row.attempts},
    )
