"""The intake: register listed objects, claim one, read and map it, carry out the decision.

The order of effects is what bounds a poison mail (I6, COR-19):

* A row is claimed in its own committed statement that counts the attempt and leases the row
  (`next_attempt_at` in the future), so even a crash in the middle of a poison mail counts
  towards `INBOUND_EMAIL_MAX_ATTEMPTS`; when the budget is spent the object is quarantined
  unread.
* The mail is then handled in one transaction that holds the row lock; its body runs in a
  savepoint, so an exception rolls back only the handling, and the failure is recorded in the
  same (still healthy) transaction.
* Store effects (delete, move to quarantine) happen only after the outcome has committed
  (`store_sync`, called by the poller).
* SES's verdicts (when checked) and the header-only rejections are decided on the header
  block; only what passes them has its body parsed. A rejection the PI can act on queues a
  notice in the same transaction (`notices`).
* An accepted instruction is saved first (Reply, relay_status=pending) and the mail stays in
  the intake (status awaiting_relay) until the relay has posted or inboxed it (I8, COR-32).

Whether a mail counts is `acceptance.decide` (pure); this module loads what it needs and
writes what it decided.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import (
    DatabaseError,
    IntegrityError,
    connection,
    transaction,
)
from django.db.models import Q
from django.db.models.functions import Lower

from inbound_email import delivery_reports
from inbound_email.conf import get_config
from inbound_email.exceptions import StoreNotFound
from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import ParsedMail, parse_headers, parse_mail
from inbound_email.replies import header_rejection
from inbound_email.services.acceptance import (
    Accept,
    NotificationSnapshot,
    Quarantine,
    Reject,
    decide,
    screen,
    screen_ses_verdicts,
)
from inbound_email.services.attachments import reply_attachments_keep
from inbound_email.services.ledger import (
    mail_finish,
    mail_record_failure,
    mail_reject,
    mail_set_quarantined,
    reply_complete,
)
from inbound_email.services.notices import rejection_notice
from inbound_email.services.relay import reply_relay_enqueue
from inbound_email.stores import MailStore, StoredObject, sha256_hex
from inbound_email.verdicts import read_authentication_results_dmarc, read_ses_verdicts
from notifications.models import EmailNotification
from notifications.reply_address import token_from_address
from notifications.services import notification_unsubscribe
from project.db_clock import db_now
from project.reconnect import connection_lost, discard_broken_connection

logger = logging.getLogger(__name__)

Status = InboundEmail.Status
Reason = InboundEmail.Reason

CLAIM_LEASE_SECONDS = 600  # a claimed row is not re-claimed for this long (crash recovery)


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
    now = db_now()
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

    The claim is one statement (UPDATE .. WHERE id = (SELECT .. FOR UPDATE SKIP LOCKED)
    RETURNING), one round trip per mail; when it claims nothing, the ORM path below only
    quarantines a row whose attempts are spent.
    """
    max_attempts = get_config().max_attempts
    lease_until = now + timedelta(seconds=CLAIM_LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL.format(table=connection.ops.quote_name(InboundEmail._meta.db_table)),
            [lease_until, now, inbound_email_id, max_attempts, now],
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
        if row.attempts >= max_attempts:
            mail_set_quarantined(
                row,
                reason=Reason.TOO_MANY_ATTEMPTS,
                detail=f"gave up after {row.attempts} attempts (the last may have crashed the "
                "worker); last error below",
                now=now,
            )
            return row, True
        return None, False  # became due or was released after the claim above: next poll


def inbound_email_due_unlisted(*, listed_since: datetime, limit: int) -> list[int]:
    """Rows still to handle that were due before a complete listing began (`listed_since`).

    After such a listing every listed row that was due is handled or leased by a poller (its
    `next_attempt_at` moved past `listed_since`), so what is left here is mail the listing no
    longer shows: its object was deleted by someone else. Claimed and handled like any row,
    it reaches its end (quarantined `vanished`, or `too_many_attempts`) instead of staying
    `received` unseen for good; an object that is back meanwhile is simply handled.
    """
    return list(
        InboundEmail.objects.filter(status=Status.RECEIVED)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lt=listed_since))
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[: max(limit, 0)]
    )


# --- the per-object step --------------------------------------------------------------------


def inbound_email_handle(*, inbound_email_id: int, store: MailStore) -> Outcome | None:
    """Claim and handle one object. None when another poller has it or it is not due.

    The caller brings the store in line afterwards (`inbound_email_finalize`), once the
    outcome has committed. Never raises for a problem with the mail or the store: the error
    is counted on the row and the object is retried (transient) or quarantined (permanent,
    or attempts spent).
    """
    now = db_now()
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
                    mail_record_failure(row, exc, now, raw=raw_read)
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
                mail_record_failure(row, exc, now)
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
    max_bytes = get_config().max_bytes
    if row.size > max_bytes:
        mail_set_quarantined(
            row,
            reason=Reason.OVERSIZE,
            detail=f"{row.size} bytes listed, limit {max_bytes}: not read",
            now=now,
        )
        return
    try:
        raw = store.get(row.store_key)
    except StoreNotFound:
        mail_set_quarantined(
            row,
            reason=Reason.VANISHED,
            detail="the object vanished from the store before it was read (deleted by "
            "someone else: an operator or a lifecycle rule); the mail is lost unless a copy "
            "is found",
            now=now,
        )
        return
    if len(raw) > max_bytes:
        row.size = len(raw)
        mail_set_quarantined(row, reason=Reason.OVERSIZE, detail=f"{len(raw)} bytes read", now=now)
        return
    row.raw = raw
    row.size = len(raw)
    row.sha256 = sha256_hex(raw)
    mail = parse_headers(raw)  # header-only checks first: what they reject is never body-parsed
    verdict = _ses_verdict(row, mail)
    if verdict is None and _delivery_report(row, mail, raw, now):
        return  # a bounce or complaint report (issue 23): recorded, never read as a reply
    if verdict is None and header_rejection(mail) is None:
        mail = parse_mail(raw)  # past a parsing limit: MailLimitExceeded -> quarantined at once
    _map_mail(row, mail)
    if isinstance(verdict, Quarantine):
        mail_set_quarantined(row, reason=verdict.reason, detail=verdict.detail, now=now)
    elif isinstance(verdict, Reject):
        # Before the Message-ID is claimed: a forgery carrying the Message-ID of a genuine
        # reply still on its way must not make the genuine one a "duplicate".
        mail_reject(row, verdict.reason, verdict.detail, now)
    else:
        _accept_or_reject(row, mail, now, store)


def _delivery_report(row: InboundEmail, mail: ParsedMail, raw: bytes, now: datetime) -> bool:
    """A DSN or ARF report goes onto the suppression list and the mail is rejected as a
    bounce; True when it was one (`inbound_email/delivery_reports.py`)."""
    if not delivery_reports.looks_like_delivery_report(mail):
        return False
    report = delivery_reports.read_delivery_report(raw)
    if report is None:
        return False
    _map_mail(row, mail)
    _, left_out = delivery_reports.delivery_report_record(
        report=report, raw=raw, mail_key=row.store_key, now=now
    )
    detail = delivery_reports.describe(report, left_out)
    mail_reject(row, Reason.BOUNCE, f"{report.source}: {detail}", now)
    return True


def _ses_verdict(row: InboundEmail, mail: ParsedMail) -> Reject | Quarantine | None:
    """SES's verdicts from the header block, when the check is on (`verdicts.py`)."""
    config = get_config()
    if not config.check_ses_verdicts:
        return None
    verdicts = read_ses_verdicts(mail.headers)
    auth_results_dmarc = read_authentication_results_dmarc(
        mail.headers, authserv_id=config.authserv_id
    )
    if not verdicts.any_present():
        # Scanning off in the receipt rule, or not SES: nothing to check, and a sender's own
        # X-SES fields would be the topmost ones; an operator should know, not guess.
        logger.warning(
            "mail #%s has no SES verdict headers although the verdict check is on",
            row.pk,
            extra={"action": "ses_verdicts_missing", "mail_key": row.store_key},
        )
    return screen_ses_verdicts(verdicts, auth_results_dmarc=auth_results_dmarc)


def _map_mail(row: InboundEmail, mail: ParsedMail) -> None:
    """The parsed mail's fields on its ledger row (cut to the columns' sizes)."""
    row.message_id = mail.message_id
    row.from_address = mail.from_address
    row.to_addresses = ", ".join(mail.recipients)[:5000]
    row.subject = mail.subject
    row.sent_at = mail.date
    row.headers_text = mail.headers_text()[:50_000]
    row.body_text = mail.text[:100_000]


_FIELDS_BUT_RAW = [
    f.name for f in InboundEmail._meta.concrete_fields if not f.primary_key and f.name != "raw"
]


def _dedupe(row: InboundEmail, mail: ParsedMail) -> InboundEmail | None:
    """Save the parsed row claiming its Message-ID; return the original if another row has it."""
    row.dedup_key = (mail.message_id or f"sha256:{row.sha256}")[:600]
    try:
        with transaction.atomic():
            # The partial unique index decides, also between concurrent pollers. The raw
            # bytes are written once, by the outcome's save (cut for a rejected mail): a
            # full copy written here would stay in the table as a dead version until vacuum.
            row.save(update_fields=_FIELDS_BUT_RAW)
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


def _snapshot(notification: EmailNotification, now: datetime) -> NotificationSnapshot:
    """Read under the notification's row lock, so two pollers count each other's replies."""
    recent = Reply.objects.filter(
        notification=notification, created_at__gte=now - timedelta(hours=1)
    ).count()
    return NotificationSnapshot(
        to_address=notification.to_address or "",
        status=str(notification.status),
        expires_at=notification.expires_at,
        has_proposal=notification.proposal_id is not None,
        replies_last_hour=recent,
    )


def _accept_or_reject(row: InboundEmail, mail: ParsedMail, now: datetime, store: MailStore) -> None:
    original = _dedupe(row, mail)
    if original is not None:
        return mail_reject(row, Reason.DUPLICATE, f"same Message-ID as #{original.pk}", now)
    screened = screen(mail)
    if screened is not None:
        return mail_reject(row, screened.reason, screened.detail, now)
    notification, token = _find_notification(mail)
    if notification is not None:
        row.notification = notification
    decision = decide(
        mail=mail,
        token=token,
        notification=_snapshot(notification, now) if notification is not None else None,
        now=now,
        max_replies_per_hour=get_config().max_replies_per_token_per_hour,
    )
    if not isinstance(decision, Accept):
        if notification is not None:
            # Same transaction as the rejection, under the notification's row lock (the cap).
            notice = rejection_notice(notification=notification, reason=decision.reason, now=now)
            if notice is not None:  # a reprocessed row keeps the notice it already had
                row.rejection_notice = notice
        return mail_reject(row, decision.reason, decision.detail, now)
    assert notification is not None  # decide() accepts only a known notification
    if decision.unsubscribe:
        notification_unsubscribe(token=notification.token)
        mail_finish(row, Status.PROCESSED, Reason.NONE, "unsubscribed: notifications paused", now)
        return None
    _record_reply(row, notification, decision, mail, now, store)
    return None


def _record_reply(
    row: InboundEmail,
    notification: EmailNotification,
    decision: Accept,
    mail: ParsedMail,
    now: datetime,
    store: MailStore,
) -> None:
    content = decision.content
    assert content is not None
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
        # Attachments are relayed with the instruction, also with a rating only (issue 21).
        relay_status=Reply.RelayStatus.PENDING
        if content.instruction or any(not a.kept_in_raw for a in mail.attachments)
        else Reply.RelayStatus.NONE,
        slack_channel=(proposal.slack_channel if proposal else "")[:64],
    )
    reply_attachments_keep(reply=reply, attachments=mail.attachments, store=store)
    logger.info(
        "reply accepted: mail #%s notification %s rating=%s instruction=%s chars",
        row.pk,
        notification.pk,
        content.rating,
        len(content.instruction),
        extra={"action": "reply_accepted", "mail_key": row.store_key, "reply_id": reply.pk},
    )
    if reply.relay_status == Reply.RelayStatus.PENDING:
        # The mail stays in the intake until the instruction is posted or inboxed (I8).
        row.status = Status.AWAITING_RELAY
        row.save()
        reply_relay_enqueue(reply_id=reply.pk)
    else:
        reply_complete(reply, row, now)
