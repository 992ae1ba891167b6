"""State changes of inbound mail: claim, handle, fail, quarantine, relay, reprocess, discard.

The order of effects is what makes COR-19 and COR-32 impossible:

* A row is claimed in its own committed transaction that counts the attempt and leases the
  row (`next_attempt_at` in the future), so even a crash in the middle of a poison mail counts
  towards `INBOUND_EMAIL_MAX_ATTEMPTS`; when the budget is spent the object is quarantined
  unread (I6).
* The mail is then handled in one transaction that holds the row lock; its body runs in a
  savepoint, so an exception rolls back only the handling, and the failure is recorded in the
  same (still healthy) transaction.
* Store effects (delete, move to quarantine) happen only after the outcome has committed.
* An instruction is saved first (Reply, relay_status=pending) and the mail stays in the intake
  (status awaiting_relay) until the relay has posted it or recorded it in the database inbox;
  only then is the notification marked responded and the mail deleted (I8, COR-32). Meanwhile
  the expiry sweep skips a notification that has an accepted reply, so an answer whose relay
  is still retrying is never counted as missed (I13).
"""

from __future__ import annotations

import logging
import re
import traceback
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from inbound_email.exceptions import MailNotInState, SlackPostError, StoreError, StoreNotFound
from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import ParsedMail, parse_mail, raw_preview
from inbound_email.replies import auto_reply_reason, split_reply
from inbound_email.slack import escape_mrkdwn, post_message, slack_enabled
from inbound_email.stores import MailStore, StoredObject, sha256_hex
from jobs.backoff import retry_delay
from notifications.exceptions import NotificationNotOpen
from notifications.models import EmailNotification
from notifications.reply_address import token_from_address
from notifications.services import notification_mark_responded, notification_unsubscribe
from project.reconnect import connection_lost, discard_broken_connection
from project.redaction import redact_address

logger = logging.getLogger(__name__)

Status = InboundEmail.Status
Reason = InboundEmail.Reason

CLAIM_LEASE_SECONDS = 600  # a claimed row is not re-claimed for this long (crash recovery)
RELAY_JOB_KIND = "inbound_email.relay_reply"
RELAY_STALE_SECONDS = 900  # a pending relay this overdue lost its wake-up: enqueue it again
SLACK_TEXT_LIMIT = 3000  # characters of instruction in the Slack message (full text kept)


def backoff_seconds(attempt: int, *, base: float, cap: float) -> float:
    """The jobs app's exponential backoff (capped, with up to 20 % jitter), on mail's own
    base and cap settings."""
    return retry_delay(attempt, base=base, cap=cap, jitter=0.2)


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    inbound_email_id: int

    @property
    def label(self) -> str:
        return f"{self.status}:{self.reason}" if self.reason else self.status


# --- registration and claim ---------------------------------------------------------------


def inbound_email_register(*, objects: list[StoredObject]) -> dict[str, InboundEmail]:
    """Ledger rows for listed objects (one INSERT .. ON CONFLICT DO NOTHING); keyed by key."""
    keys = [o.key for o in objects]
    now = timezone.now()
    InboundEmail.objects.bulk_create(
        [
            InboundEmail(store_key=o.key, etag=o.etag[:200], size=o.size, next_attempt_at=now)
            for o in objects
        ],
        ignore_conflicts=True,
    )
    return {
        row.store_key: row
        for row in InboundEmail.objects.filter(store_key__in=keys).only(
            "id", "store_key", "status", "next_attempt_at", "quarantine_key", "size"
        )
    }


_CLAIM_SQL = """
UPDATE {table} SET attempts = attempts + 1, next_attempt_at = %s, updated_at = %s
WHERE id = (
    SELECT id FROM {table}
    WHERE id = %s AND status = 'received' AND attempts < %s
      AND (next_attempt_at IS NULL OR next_attempt_at <= %s)
    FOR UPDATE SKIP LOCKED
)
RETURNING attempts
"""


def _claim(*, inbound_email_id: int, now: datetime) -> tuple[InboundEmail | None, bool]:
    """Lease a due row for this poller; (row, exhausted). Skips rows another poller holds.

    On PostgreSQL the common case is one statement (UPDATE .. WHERE id = (SELECT .. FOR
    UPDATE SKIP LOCKED) RETURNING), one round trip per mail; the ORM path below handles the
    rest (spent attempts, SQLite).
    """
    lease_until = now + timedelta(seconds=CLAIM_LEASE_SECONDS)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                _CLAIM_SQL.format(table=connection.ops.quote_name(InboundEmail._meta.db_table)),
                [lease_until, now, inbound_email_id, settings.INBOUND_EMAIL_MAX_ATTEMPTS, now],
            )
            claimed = cursor.fetchone()
        if claimed is not None:
            return InboundEmail(pk=inbound_email_id, attempts=claimed[0]), False
    with transaction.atomic():
        row = (
            InboundEmail.objects.select_for_update(skip_locked=True)
            .filter(pk=inbound_email_id, status=Status.RECEIVED)
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
            .defer("raw")
            .first()
        )
        if row is None:
            return None, False
        if row.attempts >= settings.INBOUND_EMAIL_MAX_ATTEMPTS:
            _set_quarantined(
                row,
                reason=Reason.TOO_MANY_ATTEMPTS,
                detail=f"gave up after {row.attempts} attempts (the last may have crashed the "
                "worker); last error below",
                now=now,
            )
            return row, True
        row.attempts += 1
        row.next_attempt_at = lease_until
        row.save(update_fields=["attempts", "next_attempt_at", "updated_at"])
        return row, False


# --- the per-object step --------------------------------------------------------------------


def inbound_email_handle(*, inbound_email_id: int, store: MailStore) -> Outcome | None:
    """Claim and handle one object. None when another poller has it or it is not due.

    The caller brings the store in line afterwards (`inbound_email_finalize`), once the
    outcome has committed. Never raises for a problem with the mail or the store: the error
    is counted on the row and the object is retried (transient) or quarantined (permanent,
    or attempts spent).
    """
    now = timezone.now()
    claimed, exhausted = _claim(inbound_email_id=inbound_email_id, now=now)
    if claimed is None:
        return None
    if not exhausted:
        try:
            with transaction.atomic():
                row = _claimed_row(claimed)
                if row is None:  # our lease ran out and another poller took the row over
                    return None
                try:
                    with transaction.atomic():
                        _handle(row, store, now)
                except Exception as exc:  # noqa: BLE001 - one object's failure never stops the batch
                    raw_read = row.raw  # the bytes survive the rollback: keep them for the admin
                    row = InboundEmail.objects.select_for_update().get(pk=claimed.pk)
                    _record_failure(row, exc, now, raw=raw_read)
        except DatabaseError as exc:
            if not connection_lost(exc):
                raise
            # The session died mid-mail (server restart, failover, pg_terminate_backend) and
            # took the whole attempt with it. Count it on a fresh connection, so the mail is
            # retried after the backoff, not after the claim's lease (CLAIM_LEASE_SECONDS).
            discard_broken_connection()
            with transaction.atomic():
                row = _claimed_row(claimed)
                if row is None:
                    return None
                _record_failure(row, exc, now)
        claimed = row
    return Outcome(str(claimed.status), str(claimed.reason), claimed.pk)


def _claimed_row(claimed: InboundEmail) -> InboundEmail | None:
    """The row locked, if it is still the claim we made (status and attempt unchanged)."""
    return (
        InboundEmail.objects.select_for_update()
        .filter(pk=claimed.pk, status=Status.RECEIVED, attempts=claimed.attempts)
        .first()
    )


def _handle(row: InboundEmail, store: MailStore, now: datetime) -> None:
    if row.size > settings.INBOUND_EMAIL_MAX_BYTES:
        _set_quarantined(
            row,
            reason=Reason.OVERSIZE,
            detail=f"{row.size} bytes listed, limit {settings.INBOUND_EMAIL_MAX_BYTES}: not read",
            now=now,
        )
        return
    try:
        raw = store.get(row.store_key)
    except StoreNotFound:
        _finish(row, Status.DISCARDED, Reason.NONE, "the object vanished from the store", now)
        return
    if len(raw) > settings.INBOUND_EMAIL_MAX_BYTES:
        row.size = len(raw)
        _set_quarantined(row, reason=Reason.OVERSIZE, detail=f"{len(raw)} bytes read", now=now)
        return
    row.raw = raw
    row.size = len(raw)
    row.sha256 = sha256_hex(raw)
    mail = parse_mail(raw)
    row.message_id = mail.message_id
    row.from_address = mail.from_address
    row.to_addresses = ", ".join(mail.recipients)[:5000]
    row.subject = mail.subject
    row.sent_at = mail.date
    row.headers_text = mail.headers_text()[:50_000]
    row.body_text = mail.text[:100_000]
    _accept_or_reject(row, mail, now)


def _dedupe(row: InboundEmail, mail: ParsedMail) -> InboundEmail | None:
    """Save the parsed row claiming its Message-ID; return the original if another row has it."""
    row.dedup_key = (mail.message_id or f"sha256:{row.sha256}")[:600]
    try:
        with transaction.atomic():
            row.save()  # the partial unique index decides, also between concurrent pollers
        return None
    except IntegrityError:
        original = (
            InboundEmail.objects.filter(dedup_key=row.dedup_key, duplicate_of__isnull=True)
            .exclude(pk=row.pk)
            .only("id")
            .first()
        )
        if original is None:
            raise
    row.duplicate_of = original
    return original


def _find_notification(mail: ParsedMail) -> tuple[EmailNotification | None, str]:
    """The notification the mail answers (locked), and the token seen ("" when none)."""
    tokens = [t for t in (token_from_address(a) for a in mail.recipients) if t]
    qs = EmailNotification.objects.select_for_update(of=("self",)).select_related("proposal")
    if tokens:
        return qs.filter(token__in=tokens).first(), tokens[0]
    # SES stores its id without a domain (In-Reply-To: <id@email.amazonses.com>); the Django
    # sender stores the full id@domain: match both forms, case-insensitively.
    full_ids = [m for m in mail.in_reply_to if m]
    local_ids = [m.partition("@")[0] for m in full_ids if m.partition("@")[0]]
    if local_ids:
        found = (
            qs.alias(message_id=Lower("ses_message_id"))
            .filter(Q(message_id__in=[*full_ids, *local_ids]) | Q(token__in=local_ids))
            .first()
        )
        return found, (found.token if found else local_ids[0])
    return None, ""


_UNSUBSCRIBE_SUBJECT_RE = re.compile(r"^\s*(?:(?:re|aw|fwd?)\s*:\s*)*unsubscribe\s*$", re.I)


def _is_unsubscribe(mail: ParsedMail) -> bool:
    """The List-Unsubscribe mailto (subject "unsubscribe", also as "Re:"/"AW:"/"Fwd:" reply)
    or a reply whose first non-empty line says just "unsubscribe"."""
    if _UNSUBSCRIBE_SUBJECT_RE.match(mail.subject):
        return True
    first = next((line.strip() for line in mail.reply_text.splitlines() if line.strip()), "")
    return first.lower() == "unsubscribe"


def _accept_or_reject(row: InboundEmail, mail: ParsedMail, now: datetime) -> None:
    original = _dedupe(row, mail)
    if original is not None:
        return _reject(row, Reason.DUPLICATE, f"same Message-ID as #{original.pk}", now)
    auto = auto_reply_reason(mail)
    if auto is not None:
        return _reject(row, Reason(auto[0]), auto[1], now)
    notification, token = _find_notification(mail)
    if not token:
        return _reject(row, Reason.NO_TOKEN, "no reply token in the recipients or In-Reply-To", now)
    if notification is None:
        return _reject(row, Reason.UNKNOWN_TOKEN, "the token matches no notification", now)
    row.notification = notification
    expected = (notification.to_address or "").strip().lower()
    if mail.from_count != 1 or not expected or mail.from_address != expected:
        return _reject(
            row,
            Reason.SENDER_MISMATCH,
            f"from {redact_address(mail.from_address)} ({mail.from_count} From addresses), "
            f"notification went to {redact_address(expected)}",
            now,
        )
    if _is_unsubscribe(mail):
        # A request, not an instruction; honoured also once the notification has expired.
        notification_unsubscribe(token=notification.token)
        _finish(row, Status.PROCESSED, Reason.NONE, "unsubscribed: notifications paused", now)
        return None
    expired = notification.expires_at is not None and notification.expires_at <= now
    if expired or notification.status == EmailNotification.Status.EXPIRED:
        return _reject(row, Reason.EXPIRED_TOKEN, f"expired at {notification.expires_at}", now)
    if notification.status not in (
        EmailNotification.Status.SENT,
        EmailNotification.Status.RESPONDED,
    ):
        return _reject(row, Reason.TOKEN_NOT_OPEN, f"notification is {notification.status}", now)
    if notification.proposal_id is None:
        # A digest: an instruction could reach no conversation (the raw mail is kept).
        return _reject(row, Reason.NO_PROPOSAL, "instructions must answer a proposal's email", now)
    recent = Reply.objects.filter(
        notification=notification, created_at__gte=now - timedelta(hours=1)
    ).count()
    if recent >= settings.MAX_REPLIES_PER_TOKEN_PER_HOUR:
        return _reject(
            row,
            Reason.RATE_LIMITED,
            f"{recent} replies in the last hour (limit {settings.MAX_REPLIES_PER_TOKEN_PER_HOUR})",
            now,
        )
    content = split_reply(mail.reply_text)
    if content.rating is None and not content.instruction:
        if content.rating_error:
            return _reject(row, Reason.INVALID_RATING, content.rating_error, now)
        return _reject(row, Reason.EMPTY_REPLY, "no rating and no instruction in the reply", now)
    proposal = notification.proposal
    reply = Reply.objects.create(
        inbound_email=row,
        notification=notification,
        rating=content.rating,
        rating_error=content.rating_error,
        instruction=content.instruction,
        relay_status=Reply.RelayStatus.PENDING if content.instruction else Reply.RelayStatus.NONE,
        slack_channel=(proposal.slack_channel if proposal else "")[:64],
    )
    logger.info(
        "reply accepted: mail #%s notification %s rating=%s instruction=%s chars",
        row.pk,
        notification.pk,
        content.rating,
        len(content.instruction),
        extra={"action": "reply_accepted", "mail_key": row.store_key, "reply_id": reply.pk},
    )
    if content.instruction:
        from jobs import enqueue

        # The mail stays in the intake until the instruction is posted or inboxed (I8).
        row.status = Status.AWAITING_RELAY
        row.save()
        enqueue(RELAY_JOB_KIND, {"reply_id": reply.pk})
    else:
        _complete_reply(reply, row, now)


def _reject(row: InboundEmail, reason: str, detail: str, now: datetime) -> None:
    _finish(row, Status.REJECTED, reason, detail, now)
    logger.info(
        "mail #%s rejected: %s (%s)",
        row.pk,
        reason,
        detail,
        extra={"action": "mail_rejected", "mail_key": row.store_key, "reason": str(reason)},
    )


def _finish(row: InboundEmail, status: str, reason: str, detail: str, now: datetime) -> None:
    row.status = status
    row.reason = reason
    row.detail = detail[:2000]
    row.finished_at = now
    row.next_attempt_at = None
    if status in (Status.PROCESSED, Status.DISCARDED):
        row.raw = None
    row.save()


def _set_quarantined(row: InboundEmail, *, reason: str, detail: str, now: datetime) -> None:
    _finish(row, Status.QUARANTINED, reason, detail, now)
    logger.warning(
        "mail #%s quarantined: %s (%s)",
        row.pk,
        reason,
        detail,
        extra={"action": "mail_quarantined", "mail_key": row.store_key, "reason": str(reason)},
    )


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, StoreError):
        return exc.transient
    return isinstance(exc, OperationalError | InterfaceError | TimeoutError | ConnectionError)


def _record_failure(
    row: InboundEmail, exc: BaseException, now: datetime, *, raw: bytes | None = None
) -> None:
    """Count the error on the row: retry a transient one later, quarantine anything else."""
    row.last_error = "".join(traceback.format_exception(exc))[-20_000:]
    transient = _is_transient(exc)
    if raw is not None and not transient:
        # What the admin shows of a quarantined mail, without the parser that may have failed.
        row.raw, row.size, row.sha256 = raw, len(raw), sha256_hex(raw)
        row.headers_text, row.body_text = raw_preview(raw)
    if transient and row.attempts < settings.INBOUND_EMAIL_MAX_ATTEMPTS:
        delay = backoff_seconds(
            row.attempts,
            base=settings.INBOUND_EMAIL_RETRY_BASE_SECONDS,
            cap=settings.INBOUND_EMAIL_RETRY_CAP_SECONDS,
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
    reason = Reason.TOO_MANY_ATTEMPTS if transient else Reason.PERMANENT_ERROR
    _set_quarantined(row, reason=reason, detail=f"{type(exc).__name__}: {exc}"[:2000], now=now)
    logger.error(
        "mail #%s quarantined after error: %s",
        row.pk,
        exc,
        exc_info=exc,
        extra={"action": "mail_failed", "mail_key": row.store_key, "attempt": row.attempts},
    )


# --- after commit: the store follows the ledger -------------------------------------------


def inbound_email_finalize(*, ids: list[int], store: MailStore) -> int:
    """Make the store match finished rows: delete intake objects, move quarantined ones.

    Runs after the outcomes committed, and again on any later poll that still lists a key (a
    failed delete, or a redelivery of a handled object). Returns how many rows are in line.
    Rows another transaction holds (a reprocess in progress) are left alone.
    """
    if not ids:
        return 0
    with transaction.atomic():
        rows = list(
            InboundEmail.objects.select_for_update(skip_locked=True)
            .filter(pk__in=ids, status__in=InboundEmail.TERMINAL_STATUSES)
            .only("id", "store_key", "status", "quarantine_key")
        )
        ready = []
        for row in rows:
            if row.status == Status.QUARANTINED and not row.quarantine_key:
                try:
                    row.quarantine_key = store.quarantine(row.store_key)
                except StoreNotFound:
                    pass  # nothing left in the intake to move
                except StoreError as exc:
                    _log_cleanup_failure(row, exc)
                    continue
                row.save(update_fields=["quarantine_key"])
            ready.append(row)
        try:
            failed = store.delete_many([row.store_key for row in ready])
        except StoreError as exc:
            for row in ready:
                _log_cleanup_failure(row, exc)
            return 0
        for row in ready:
            if row.store_key in failed:
                _log_cleanup_failure(row, StoreError(failed[row.store_key], transient=True))
        done = [row.pk for row in ready if row.store_key not in failed]
        InboundEmail.objects.filter(pk__in=done).update(intake_deleted=True)
        return len(done)


def _log_cleanup_failure(row: InboundEmail, exc: Exception) -> None:
    logger.warning(
        "mail #%s: store clean-up failed, retried on the next poll: %s",
        row.pk,
        exc,
        extra={"action": "mail_cleanup_failed", "mail_key": row.store_key},
    )


# --- the instruction relay (outbox) ---------------------------------------------------------


def slack_text(reply: Reply) -> str:
    notification = reply.notification
    user = notification.user
    who = user.get_full_name() or user.get_username()
    title = (
        notification.proposal.title if notification.proposal else f"notification {notification.pk}"
    )
    instruction = reply.instruction
    if len(instruction) > SLACK_TEXT_LIMIT:
        instruction = (
            instruction[:SLACK_TEXT_LIMIT]
            + f"\n[… truncated; the full text is reply #{reply.pk} in the admin]"
        )
    return (
        f"Instruction by email reply from {escape_mrkdwn(who)} on "
        f"\u201c{escape_mrkdwn(title)}\u201d:\n{escape_mrkdwn(instruction)}"
    )


def reply_relay_sweep(*, stale_seconds: float = RELAY_STALE_SECONDS) -> int:
    """Re-enqueue relays whose wake-up was lost (e.g. a job that failed for an unexpected
    reason): pending replies whose next attempt is long overdue. Returns how many.

    A duplicate wake-up is harmless: the relay locks the reply and checks its status.
    """
    from jobs import enqueue

    now = timezone.now()
    stale = now - timedelta(seconds=stale_seconds)
    with transaction.atomic():
        replies = list(
            Reply.objects.select_for_update(skip_locked=True)
            .filter(relay_status=Reply.RelayStatus.PENDING)
            .filter(
                Q(relay_next_attempt_at__lt=stale)
                | Q(relay_next_attempt_at__isnull=True, created_at__lt=stale)
            )
            .only("id")[:500]
        )
        for reply in replies:
            enqueue(RELAY_JOB_KIND, {"reply_id": reply.pk})
        Reply.objects.filter(pk__in=[r.pk for r in replies]).update(relay_next_attempt_at=now)
    if replies:
        logger.warning(
            "re-enqueued %s overdue instruction relays",
            len(replies),
            extra={"action": "instruction_relay_requeued"},
        )
    return len(replies)


def reply_relay(*, reply_id: int) -> str:
    """One relay attempt of a pending instruction: "posted", "inboxed", "retry" or "skipped".

    Slack off: the instruction goes to the database inbox at once. Slack on: a failed post
    (no channel, API error, 429) is retried with backoff (at least Retry-After); when the
    budget is spent it goes to the database inbox with `needs_operator`. Only once it is
    posted or inboxed is the notification marked responded and the mail processed (and deleted
    from the intake).
    """
    now = timezone.now()
    with transaction.atomic():
        reply = (
            Reply.objects.select_for_update(of=("self",))
            .select_related("notification__user", "notification__proposal", "inbound_email")
            .filter(pk=reply_id)
            .first()
        )
        if reply is None or reply.relay_status != Reply.RelayStatus.PENDING:
            return "skipped"
        if reply.relay_next_attempt_at and reply.relay_next_attempt_at > now + timedelta(seconds=1):
            return "skipped"  # a duplicate wake-up before the scheduled retry
        reply.relay_attempts += 1
        if not slack_enabled():
            _inbox(reply, fallback_error="")
            outcome = "inboxed"
        else:
            proposal = reply.notification.proposal
            # The proposal's current channel: one configured after a failed attempt is used.
            reply.slack_channel = (
                proposal.slack_channel if proposal else ""
            ) or reply.slack_channel
            try:
                reply.slack_ts = post_message(channel=reply.slack_channel, text=slack_text(reply))
            except SlackPostError as exc:
                if reply.relay_attempts >= settings.INBOUND_RELAY_MAX_ATTEMPTS:
                    _inbox(reply, fallback_error=str(exc))
                    outcome = "inboxed"
                else:
                    _schedule_relay_retry(reply, exc, now)
                    return "retry"
            else:
                reply.relay_status = Reply.RelayStatus.POSTED
                outcome = "posted"
                logger.info(
                    "instruction of reply %s posted to Slack (attempt %s)",
                    reply.pk,
                    reply.relay_attempts,
                    extra={"action": "instruction_posted", "reply_id": reply.pk},
                )
        row = InboundEmail.objects.select_for_update().get(pk=reply.inbound_email_id)
        _complete_reply(reply, row, now)
        # The mail leaves the intake only after the outcome commits (the job runner's
        # transaction when run as a job).
        inbound_email_id = reply.inbound_email_id
        transaction.on_commit(
            lambda: inbound_email_finalize(ids=[inbound_email_id], store=_default_store()),
            robust=True,
        )
    return outcome


def _default_store() -> MailStore:
    from inbound_email.stores import default_store

    return default_store()


def _schedule_relay_retry(reply: Reply, exc: SlackPostError, now: datetime) -> None:
    from jobs import enqueue

    delay = backoff_seconds(
        reply.relay_attempts,
        base=settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS,
        cap=settings.INBOUND_RELAY_BACKOFF_CAP_SECONDS,
    )
    if exc.retry_after is not None:
        delay = max(delay, exc.retry_after)
    reply.relay_next_attempt_at = now + timedelta(seconds=delay)
    reply.relay_last_error = str(exc)[:2000]
    reply.save(
        update_fields=[
            "relay_attempts",
            "relay_next_attempt_at",
            "relay_last_error",
            "slack_channel",
        ]
    )
    enqueue(RELAY_JOB_KIND, {"reply_id": reply.pk}, run_after=reply.relay_next_attempt_at)
    logger.warning(
        "instruction of reply %s not posted (attempt %s, retry in %.0fs): %s",
        reply.pk,
        reply.relay_attempts,
        delay,
        exc,
        extra={
            "action": "instruction_retry",
            "reply_id": reply.pk,
            "attempt": reply.relay_attempts,
        },
    )


def _inbox(reply: Reply, *, fallback_error: str) -> None:
    """Record the instruction in the database inbox (a Message with a minted canonical id)."""
    from canonical_ids import record_message

    notification = reply.notification
    proposal = notification.proposal
    message = record_message(
        run_id=(proposal.run_id if proposal else "")[:64],
        text=reply.instruction,
        author=f"pi:{notification.user_id}",
        source="email",
        metadata={
            "reply_id": reply.pk,
            "notification_id": notification.pk,
            "inbound_email_id": reply.inbound_email_id,
            "rating": reply.rating,
            "slack_failed": bool(fallback_error),
        },
    )
    reply.message_ts = message.ts
    reply.relay_status = Reply.RelayStatus.INBOXED
    if fallback_error:
        reply.needs_operator = True
        reply.relay_last_error = fallback_error[:2000]
        logger.error(
            "instruction of reply %s never reached Slack after %s attempts; recorded in the "
            "database inbox as %s for an operator: %s",
            reply.pk,
            reply.relay_attempts,
            message.ts,
            fallback_error,
            extra={"action": "instruction_inbox_fallback", "reply_id": reply.pk},
        )


def _count_answer(reply: Reply, now: datetime) -> None:
    """Mark the notification responded (resets the missed count) unless it already is.

    Called once the reply is handled durably: at once for a rating, after the relay for an
    instruction. A notification that is no longer open (expired meanwhile) is logged, never
    skipped silently.
    """
    status = (
        EmailNotification.objects.filter(pk=reply.notification_id)
        .values_list("status", flat=True)
        .first()
    )
    if status == EmailNotification.Status.RESPONDED:
        return
    try:
        if status != EmailNotification.Status.SENT:
            raise NotificationNotOpen(f"notification {reply.notification_id} is {status}")
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


def _complete_reply(reply: Reply, row: InboundEmail, now: datetime) -> None:
    """The reply is handled durably: the mail is processed (and leaves the intake)."""
    if reply.relay_status != Reply.RelayStatus.NONE:
        reply.relayed_at = now
        reply.save()
    _count_answer(reply, now)
    _finish(row, Status.PROCESSED, Reason.NONE, "", now)


# --- operator actions -----------------------------------------------------------------------


def inbound_email_raw(*, inbound_email: InboundEmail, store: MailStore | None = None) -> bytes:
    """The raw source: from the row, else from the quarantine copy, else from the intake."""
    if inbound_email.raw is not None:
        return bytes(inbound_email.raw)
    store = store or _default_store()
    if inbound_email.quarantine_key:
        return store.get_quarantined(inbound_email.quarantine_key)
    return store.get(inbound_email.store_key)


def inbound_email_reprocess(*, inbound_email_id: int, store: MailStore | None = None) -> None:
    """Put a quarantined or rejected mail back in the intake with a fresh attempt budget."""
    store = store or _default_store()
    with transaction.atomic():
        row = InboundEmail.objects.select_for_update().get(pk=inbound_email_id)
        if row.status not in (Status.QUARANTINED, Status.REJECTED):
            raise MailNotInState(f"mail #{row.pk} is {row.status}: only quarantined or rejected")
        data = inbound_email_raw(inbound_email=row, store=store)
        store.put(row.store_key, data)  # under the row lock: no poller finalizes it meanwhile
        if row.quarantine_key:
            quarantine_key = row.quarantine_key
            transaction.on_commit(lambda: _delete_quietly(store, quarantine_key))
        row.status = Status.RECEIVED
        row.reason = Reason.NONE
        row.detail = f"reprocess requested after {row.attempts} attempts"
        row.attempts = 0
        row.next_attempt_at = timezone.now()
        row.quarantine_key = ""
        row.intake_deleted = False
        row.duplicate_of = None
        row.dedup_key = ""
        row.finished_at = None
        row.save()
    logger.info(
        "mail #%s queued for reprocessing",
        row.pk,
        extra={"action": "mail_reprocess", "mail_key": row.store_key},
    )


def inbound_email_discard(*, inbound_email_id: int, store: MailStore | None = None) -> None:
    """Drop a quarantined or rejected mail for good: its stored copies and raw bytes."""
    store = store or _default_store()
    with transaction.atomic():
        row = InboundEmail.objects.select_for_update().get(pk=inbound_email_id)
        if row.status not in (Status.QUARANTINED, Status.REJECTED):
            raise MailNotInState(f"mail #{row.pk} is {row.status}: only quarantined or rejected")
        for key in filter(None, [row.quarantine_key, row.store_key]):
            store.delete(key)
        row.status = Status.DISCARDED
        row.raw = None
        row.intake_deleted = True
        row.save()
    logger.info(
        "mail #%s discarded", row.pk, extra={"action": "mail_discard", "mail_key": row.store_key}
    )


def reply_acknowledge(*, reply_ids: list[int]) -> int:
    """An operator handled instructions that needed one: clear their alarm (kept as history).

    Only replies that need an operator and are not yet acknowledged change; returns how many.
    """
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            Reply.objects.select_for_update()
            .filter(pk__in=reply_ids, needs_operator=True, operator_acknowledged_at__isnull=True)
            .values_list("pk", flat=True)
        )
        Reply.objects.filter(pk__in=ids).update(operator_acknowledged_at=now)
    for reply_id in ids:
        logger.info(
            "reply %s acknowledged by an operator",
            reply_id,
            extra={"action": "reply_acknowledged", "reply_id": reply_id},
        )
    return len(ids)


def _delete_quietly(store: MailStore, key: str) -> None:
    try:
        store.delete(key)
    except StoreError as exc:
        logger.warning("could not delete %s: %s", key, exc, extra={"action": "mail_cleanup_failed"})
