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
from typing import Any

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone

from inbound_email.exceptions import (
    MailLimitExceeded,
    MailNotInState,
    SlackLookupError,
    SlackPostError,
    StoreError,
    StoreNotFound,
)
from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import ParsedMail, parse_headers, parse_mail, raw_preview
from inbound_email.replies import auto_reply_reason, header_rejection, split_reply
from inbound_email.slack import (
    escape_mrkdwn,
    find_message,
    post_message,
    post_outcome_unknown,
    slack_enabled,
)
from inbound_email.stores import MailStore, StoredObject, sha256_hex
from jobs.backoff import retry_delay
from notifications.exceptions import NotificationNotOpen
from notifications.models import EmailNotification
from notifications.reply_address import token_from_address
from notifications.services import notification_mark_responded, notification_unsubscribe
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
        with transaction.atomic():
            row = (
                InboundEmail.objects.select_for_update()
                .filter(pk=claimed.pk, status=Status.RECEIVED, attempts=claimed.attempts)
                .first()
            )
            if row is None:  # our lease ran out and another poller took the row over
                return None
            try:
                with transaction.atomic():
                    _handle(row, store, now)
            except Exception as exc:  # noqa: BLE001 - one object's failure never stops the batch
                raw_read = row.raw  # the bytes survive the rollback: keep them for the admin
                row = InboundEmail.objects.select_for_update().get(pk=claimed.pk)
                _record_failure(row, exc, now, raw=raw_read)
        claimed = row
    return Outcome(str(claimed.status), str(claimed.reason), claimed.pk)


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
    mail = parse_headers(raw)  # header-only checks first: what they reject is never body-parsed
    if header_rejection(mail) is None:
        mail = parse_mail(raw)  # past a parsing limit: MailLimitExceeded -> quarantined at once
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
        # Kept, never silently lost; the relayed message says when some may be the PI's text.
        stripped_text=mail.reply_split.stripped[:100_000],
        cut_lines=mail.reply_split.cut_lines,
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
    if isinstance(exc, MailLimitExceeded):  # hostile or absurd mail: the limit is the reason
        _set_quarantined(row, reason=Reason(exc.reason), detail=str(exc), now=now)
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
#
# One attempt is claim -> commit -> Slack -> record, the notification sweeps' pattern: the
# claim (status `posting`, the attempt counted, the claim time) commits before any Slack
# call, and the outcome is recorded in a transaction of its own, so no rollback can undo the
# record of a post Slack accepted and no retry repeats it. A post whose outcome is unknown
# (timeout, 5xx, reset connection, or a claim left `posting` by a crash) sets
# `relay_unsure_since`; from then on each attempt first searches the channel's history for the
# message by its metadata and records it as posted when it is there, before it posts again or
# falls back to the inbox (I8: posted once, inboxed, or pending; never dropped).

RELAY_EVENT_TYPE = "pi_instruction"  # Slack message metadata of a relayed instruction
RELAY_LOOKUP_MARGIN_SECONDS = 120  # history searched from this long before the unsure claim
RELAY_LOOKUP_MAX_PAGES = 10  # of 200 messages; a longer history since then is a failed lookup


@dataclass(frozen=True)
class RelayClaim:
    """A claimed relay attempt: all the Slack step needs, so it runs without the database."""

    reply_id: int
    attempt: int
    claimed_at: datetime
    channel: str
    text: str
    unsure_since: datetime | None


@dataclass(frozen=True)
class RelayResult:
    """What the Slack step found out. `outcome`: posted | found (in the history, not posted
    again) | refused (Slack said no: not posted) | unknown (may have been posted) |
    lookup_failed | spent (budget spent and not in the history: the inbox)."""

    outcome: str
    ts: str = ""
    error: str = ""
    retry_after: float | None = None


def relay_metadata(reply_id: int) -> dict[str, Any]:
    """The Slack message metadata that identifies the post of a reply's instruction."""
    return {"event_type": RELAY_EVENT_TYPE, "event_payload": {"reply_id": reply_id}}


def cut_text_note(reply: Reply) -> str:
    """A line telling the PI's team that text of the mail was not relayed ("" when none)."""
    n = reply.cut_lines
    if not n:
        return ""
    lines = "1 line" if n == 1 else f"{n} lines"
    verb = "was" if n == 1 else "were"
    return (
        f"[{lines} of quoted/trailing text {verb} not relayed; see reply #{reply.pk} in the admin]"
    )


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
    note = cut_text_note(reply)
    return (
        f"Instruction by email reply from {escape_mrkdwn(who)} on "
        f"\u201c{escape_mrkdwn(title)}\u201d:\n{escape_mrkdwn(instruction)}"
        + (f"\n{escape_mrkdwn(note)}" if note else "")
    )


def reply_relay_sweep(*, stale_seconds: float = RELAY_STALE_SECONDS) -> int:
    """Re-enqueue relays whose wake-up was lost (e.g. a job that failed for an unexpected
    reason): pending replies whose next attempt is long overdue, and claims left `posting`
    past INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS (a worker died between the post and its record).
    Returns how many.

    A duplicate wake-up is harmless: the relay locks the reply and checks its status.
    """
    from jobs import enqueue

    now = timezone.now()
    stale = now - timedelta(seconds=stale_seconds)
    claim_expired = now - timedelta(seconds=settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS)
    with transaction.atomic():
        replies = list(
            Reply.objects.select_for_update(skip_locked=True)
            .filter(
                Q(
                    relay_status=Reply.RelayStatus.PENDING,
                    relay_next_attempt_at__lt=stale,
                )
                | Q(
                    relay_status=Reply.RelayStatus.PENDING,
                    relay_next_attempt_at__isnull=True,
                    created_at__lt=stale,
                )
                | (
                    Q(relay_status=Reply.RelayStatus.POSTING, relay_claimed_at__lt=claim_expired)
                    & (
                        Q(relay_next_attempt_at__isnull=True)
                        | Q(relay_next_attempt_at__lt=claim_expired)
                    )
                )
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
    """One relay attempt of an instruction: "posted", "inboxed", "retry" or "skipped".

    Call it outside any transaction (the job handler is registered atomic=False): the claim
    must commit before Slack is called. Slack off: the instruction goes to the database inbox
    at once. Slack on: claim -> post (or look up first, after an unknown outcome) -> record.
    A refused post (no channel, API error, 429) is retried with backoff (at least
    Retry-After) and, when the budget is spent, goes to the database inbox with
    `needs_operator`. Only once it is posted or inboxed is the notification marked responded
    and the mail processed (and deleted from the intake).
    """
    if not slack_enabled():
        return _relay_to_inbox(reply_id=reply_id, now=timezone.now())
    claim = reply_relay_claim(reply_id=reply_id, now=timezone.now())
    if claim is None:
        return "skipped"
    result = _relay_to_slack(claim)
    return reply_relay_record(claim=claim, result=result)


def _lock_reply(reply_id: int) -> Reply | None:
    return (
        Reply.objects.select_for_update(of=("self",))
        .select_related("notification__user", "notification__proposal")
        .filter(pk=reply_id)
        .first()
    )


def _due(reply: Reply, now: datetime) -> bool:
    """Whether an attempt may start: pending and due, or `posting` with an expired claim."""
    if reply.relay_status == Reply.RelayStatus.PENDING:
        # A duplicate wake-up before the scheduled retry is not due.
        return not (
            reply.relay_next_attempt_at and reply.relay_next_attempt_at > now + timedelta(seconds=1)
        )
    if reply.relay_status == Reply.RelayStatus.POSTING:
        # A live worker is posting it until its claim expires.
        timeout = timedelta(seconds=settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS)
        return reply.relay_claimed_at is None or reply.relay_claimed_at + timeout <= now
    return False


def reply_relay_claim(*, reply_id: int, now: datetime) -> RelayClaim | None:
    """Claim one relay attempt and commit it: status `posting`, the attempt counted.

    None when the reply is not due (finished, scheduled later, or claimed by a live worker).
    A claim left `posting` past its timeout is taken over: its worker may have posted and
    died before recording, so the post is marked unsure and looked up before any new one.
    """
    with transaction.atomic():
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return None
        if reply.relay_status == Reply.RelayStatus.POSTING:
            reply.relay_unsure_since = reply.relay_unsure_since or reply.relay_claimed_at
            logger.warning(
                "relay of reply %s was left posting since %s (attempt %s; the worker stopped "
                "between the post and its record?): looking it up before posting again",
                reply.pk,
                reply.relay_claimed_at,
                reply.relay_attempts,
                extra={"action": "instruction_claim_expired", "reply_id": reply.pk},
            )
        elif reply.relay_unsure_since is None:
            # The proposal's current channel: one configured after a failed attempt is used.
            # While a post is unsure it stays where that post may be (where the lookup runs).
            proposal = reply.notification.proposal
            reply.slack_channel = (
                proposal.slack_channel if proposal else ""
            ) or reply.slack_channel
        reply.relay_attempts += 1
        reply.relay_status = Reply.RelayStatus.POSTING
        reply.relay_claimed_at = now
        reply.save(
            update_fields=[
                "relay_attempts",
                "relay_status",
                "relay_claimed_at",
                "relay_unsure_since",
                "slack_channel",
            ]
        )
        # Built inside the claim's transaction: a failure here leaves no `posting` claim.
        return RelayClaim(
            reply_id=reply.pk,
            attempt=reply.relay_attempts,
            claimed_at=now,
            channel=reply.slack_channel,
            text=slack_text(reply),
            unsure_since=reply.relay_unsure_since,
        )


def _relay_to_slack(claim: RelayClaim) -> RelayResult:
    """The Slack step of one attempt; no database. Every failure becomes a RelayResult."""
    if claim.unsure_since is not None:
        try:
            ts = find_message(
                channel=claim.channel,
                event_type=RELAY_EVENT_TYPE,
                event_payload=relay_metadata(claim.reply_id)["event_payload"],
                oldest=claim.unsure_since.timestamp() - RELAY_LOOKUP_MARGIN_SECONDS,
                max_pages=RELAY_LOOKUP_MAX_PAGES,
            )
        except SlackLookupError as exc:
            return RelayResult("lookup_failed", error=str(exc), retry_after=exc.retry_after)
        if ts:
            return RelayResult("found", ts=ts)
    if claim.attempt > settings.INBOUND_RELAY_MAX_ATTEMPTS:
        return RelayResult("spent")  # only look-ups were left: it is not in Slack
    try:
        ts = post_message(
            channel=claim.channel, text=claim.text, metadata=relay_metadata(claim.reply_id)
        )
    except SlackPostError as exc:
        outcome = "unknown" if post_outcome_unknown(exc) else "refused"
        return RelayResult(outcome, error=str(exc), retry_after=exc.retry_after)
    return RelayResult("posted", ts=ts)


def reply_relay_record(*, claim: RelayClaim, result: RelayResult) -> str:
    """Record the outcome of a claimed attempt in its own transaction; returns reply_relay's
    outcome. A claim that is no longer ours (taken over after its timeout) is left alone."""
    now = timezone.now()
    budget = settings.INBOUND_RELAY_MAX_ATTEMPTS
    with transaction.atomic():
        reply = _lock_reply(claim.reply_id)
        if (
            reply is None
            or reply.relay_status != Reply.RelayStatus.POSTING
            or reply.relay_claimed_at != claim.claimed_at
        ):
            logger.warning(
                "relay of reply %s: the claim of attempt %s was taken over before its outcome "
                "(%s) was recorded; the new claim looks it up",
                claim.reply_id,
                claim.attempt,
                result.outcome,
                extra={"action": "instruction_claim_lost", "reply_id": claim.reply_id},
            )
            return "skipped"
        if result.outcome in ("posted", "found"):
            reply.slack_ts = result.ts
            reply.relay_status = Reply.RelayStatus.POSTED
            outcome = "posted"
            logger.info(
                "instruction of reply %s %s (attempt %s)",
                reply.pk,
                "posted to Slack"
                if result.outcome == "posted"
                else "found in the Slack channel's history: recorded as posted, not posted again",
                reply.relay_attempts,
                extra={"action": f"instruction_{result.outcome}", "reply_id": reply.pk},
            )
        elif result.outcome == "spent" or (result.outcome == "refused" and claim.attempt >= budget):
            _inbox(reply, fallback_error=result.error or reply.relay_last_error or "not posted")
            outcome = "inboxed"
        else:  # refused with budget left, unknown, lookup_failed: try again later
            if result.outcome == "unknown":
                reply.relay_unsure_since = reply.relay_unsure_since or claim.claimed_at
            error = result.error
            if result.outcome == "lookup_failed":
                error = f"unsure whether an earlier post arrived; {error}"
            _schedule_relay_retry(reply, error=error, retry_after=result.retry_after, now=now)
            return "retry"
        row = InboundEmail.objects.select_for_update().get(pk=reply.inbound_email_id)
        _complete_reply(reply, row, now)
        inbound_email_id = reply.inbound_email_id
        transaction.on_commit(
            lambda: inbound_email_finalize(ids=[inbound_email_id], store=_default_store()),
            robust=True,
        )
    return outcome


def _relay_to_inbox(*, reply_id: int, now: datetime) -> str:
    """Slack off: the database inbox at once, in one transaction (no external effect)."""
    with transaction.atomic():
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return "skipped"
        reply.relay_attempts += 1
        unsure = reply.relay_unsure_since is not None or reply.relay_status == "posting"
        _inbox(
            reply,
            fallback_error="Slack was turned off while a post of it was unconfirmed: it may "
            "be in Slack too"
            if unsure
            else "",
        )
        row = InboundEmail.objects.select_for_update().get(pk=reply.inbound_email_id)
        _complete_reply(reply, row, now)
        # The mail leaves the intake only after the outcome commits.
        inbound_email_id = reply.inbound_email_id
        transaction.on_commit(
            lambda: inbound_email_finalize(ids=[inbound_email_id], store=_default_store()),
            robust=True,
        )
    return "inboxed"


def _default_store() -> MailStore:
    from inbound_email.stores import default_store

    return default_store()


def _schedule_relay_retry(
    reply: Reply, *, error: str, retry_after: float | None, now: datetime
) -> None:
    from jobs import enqueue

    delay = backoff_seconds(
        reply.relay_attempts,
        base=settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS,
        cap=settings.INBOUND_RELAY_BACKOFF_CAP_SECONDS,
    )
    if retry_after is not None:
        delay = max(delay, retry_after)
    reply.relay_status = Reply.RelayStatus.PENDING
    reply.relay_next_attempt_at = now + timedelta(seconds=delay)
    reply.relay_last_error = error[:2000]
    reply.save(
        update_fields=[
            "relay_status",
            "relay_unsure_since",
            "relay_next_attempt_at",
            "relay_last_error",
        ]
    )
    enqueue(RELAY_JOB_KIND, {"reply_id": reply.pk}, run_after=reply.relay_next_attempt_at)
    spent = reply.relay_attempts >= settings.INBOUND_RELAY_MAX_ATTEMPTS
    (logger.error if spent else logger.warning)(
        "instruction of reply %s not posted (attempt %s%s, retry in %.0fs): %s",
        reply.pk,
        reply.relay_attempts,
        "; budget spent, Slack's answer unknown: looked up before the inbox" if spent else "",
        delay,
        error,
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
    note = cut_text_note(reply)
    message = record_message(
        run_id=(proposal.run_id if proposal else "")[:64],
        text=reply.instruction + (f"\n{note}" if note else ""),
        author=f"pi:{notification.user_id}",
        source="email",
        metadata={
            "reply_id": reply.pk,
            "notification_id": notification.pk,
            "inbound_email_id": reply.inbound_email_id,
            "rating": reply.rating,
            "slack_failed": bool(fallback_error),
            "cut_lines": reply.cut_lines,
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
