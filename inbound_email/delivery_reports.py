"""Bounce and complaint reports that reach the inbound address (issue 23.2), recognised before
reply parsing: they used to be rejected as replies, and the address was mailed again.

* RFC 3464 delivery status notifications (`multipart/report; report-type=delivery-status`:
  Gmail, Outlook, Postfix, SES's own): each `message/delivery-status` recipient block with
  `Action: failed` is a bounce, hard for a `5.x.x` status and soft for `4.x.x`; `delayed`,
  `delivered`, `relayed` and `expanded` are not bounces.
* Bounces that are not RFC 3464 (Exim's default text bounce with `X-Failed-Recipients`, and
  the other formats Mailman has met) are read by flufl.bounce (`all_failures`), when the
  mail comes from a mailer daemon.
* RFC 5965 ARF reports (`multipart/report; report-type=feedback-report`): a complaint about
  `Original-Rcpt-To`, or when a provider redacts it, the `To` of the returned message.

`read_delivery_report` only reads; `delivery_report_record` hands each finding to the
notifications app's suppression list (`notifications.suppression.feedback_record`), in the
intake's transaction, when the report is addressed to the envelope sender (VERP bounce
address, `notifications/bounce_address.py`) of a notification sent to that address within
BOUNCE_REPORT_DAYS (issue 28.5). Quoting a reply token proves nothing: every copy of the mail
shows it (Reply-To, the List-Unsubscribe mailto), so anyone holding a forwarded copy could
forge a "bounce" with it. Each finding is keyed on the bounced message (the notification's
SES message id), the recipient and the kind, as the SNS events are, so one bounce reported
both ways counts once.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from email import message_from_string
from email.message import Message
from email.utils import getaddresses, parseaddr

from flufl.bounce import all_failures

from inbound_email.parse_limits import (
    ParseLimits,
    check_text_parts,
    limited_parser,
    report_window,
)
from inbound_email.parsing import ParsedMail
from notifications.bounce_address import BOUNCE_REPORT_DAYS, notification_id_from_bounce_address
from notifications.models import DeliveryFeedback, EmailNotification
from notifications.suppression import FeedbackOutcome, feedback_event_key, feedback_record
from project.redaction import redact_address

logger = logging.getLogger(__name__)

Kind = DeliveryFeedback.Kind
Source = DeliveryFeedback.Source

_DAEMONS = re.compile(r"^(mailer-daemon|postmaster|mail-daemon|mailerdaemon)@", re.I)
_STATUS = re.compile(r"\b([245])\.\d{1,3}\.\d{1,3}\b")
_NOT_COMPLAINTS = {"not-spam"}
# Where the report was delivered: the report mail's own header block, never its body.
_ADDRESSED_TO = ("to", "cc", "delivered-to", "x-original-to", "envelope-to")
_MAX_ADDRESSED_TO = 20


@dataclass(frozen=True)
class Finding:
    address: str
    kind: str  # DeliveryFeedback.Kind
    detail: str  # status and diagnostic, or the feedback type


@dataclass(frozen=True)
class DeliveryReport:
    source: str  # DeliveryFeedback.Source: dsn or arf
    findings: tuple[Finding, ...]
    # The addresses the report mail itself was sent to (its top-level To, Cc, Delivered-To,
    # X-Original-To, Envelope-To): a genuine report goes to the notification's envelope sender.
    addressed_to: tuple[str, ...] = ()


def looks_like_delivery_report(mail: ParsedMail) -> bool:
    """From the header block alone: is this mail worth reading as a report?"""
    content_type = mail.content_type.lower()
    if content_type == "multipart/report":
        return True
    names = {name.lower() for name, _ in mail.headers}
    return bool(_DAEMONS.match(mail.from_address)) or "x-failed-recipients" in names


def read_delivery_report(raw: bytes, *, limits: ParseLimits | None = None) -> DeliveryReport | None:
    """The bounces or complaint the mail reports, or None when it reports none.

    Only the report window is read (`parse_limits.report_window`: the header block and the
    first INBOUND_EMAIL_MAX_REPORT_BYTES of the body), within the inbound parsing limits,
    every text part within the text limit, before any detector runs (MailLimitExceeded
    past one, as for any mail): a fake "bounce" of 10 MB costs what 32 KiB cost.
    """
    limits = limits or ParseLimits.from_settings()
    window = report_window(raw, limits)
    message = limited_parser(limits).parsebytes(window)
    check_text_parts(message, limits)
    report = _read(message, window, limits)
    if report is None:
        return None
    values = [str(v) for name, v in message.items() if name.lower() in _ADDRESSED_TO]
    addressed_to = tuple(a.lower() for _, a in getaddresses(values) if "@" in a)
    return DeliveryReport(report.source, report.findings, addressed_to[:_MAX_ADDRESSED_TO])


def _read(message: Message, window: bytes, limits: ParseLimits) -> DeliveryReport | None:
    report_type = (message.get_param("report-type") or "").lower()
    if message.get_content_type() == "multipart/report" and report_type == "feedback-report":
        return _arf(message)
    if message.get_content_type() == "multipart/report" and report_type == "delivery-status":
        findings = _dsn(message)
        if findings is not None:
            return DeliveryReport(Source.DSN, tuple(findings)) if findings else None
    return _other_bounce(message, window, limits)


def _field(block: Message, name: str) -> str:
    return " ".join(str(block.get(name, "")).split())


def _recipient(value: str) -> str:
    """`rfc822; pi@example.org` -> `pi@example.org`."""
    _, _, address = value.rpartition(";")
    return parseaddr(address.strip())[1].lower()


def _dsn(message: Message) -> list[Finding] | None:
    """RFC 3464's per-recipient blocks; None when the report has no delivery-status part."""
    for part in message.walk():
        if part.get_content_type() != "message/delivery-status":
            continue
        blocks = part.get_payload()
        if not isinstance(blocks, list):
            return None
        findings = []
        for block in blocks[1:]:  # the first block is about the message, the rest recipients
            action = _field(block, "Action").lower()
            address = _recipient(_field(block, "Final-Recipient")) or _recipient(
                _field(block, "Original-Recipient")
            )
            if action != "failed" or "@" not in address:
                continue
            status = _STATUS.search(_field(block, "Status"))
            kind = Kind.SOFT_BOUNCE if status and status.group(1) == "4" else Kind.HARD_BOUNCE
            detail = f"Status {_field(block, 'Status')}; {_field(block, 'Diagnostic-Code')}"
            findings.append(Finding(address, kind, detail.strip("; ")[:1000]))
        return findings
    return None


def _other_bounce(message: Message, window: bytes, limits: ParseLimits) -> DeliveryReport | None:
    """A bounce in another format (Exim's text bounce, ...), from a mailer daemon only.

    flufl.bounce's heuristic detectors make ~50 regular-expression passes over every line
    they are given: they scan only the first INBOUND_EMAIL_MAX_BOUNCE_SCAN_BYTES of the body
    (a real bounce names the failed address in its first lines)."""
    sender = parseaddr(str(message.get("From", "")))[1]
    if not (_DAEMONS.match(sender) or message.get("X-Failed-Recipients")):
        return None
    scanned = report_window(window, limits, body_bytes=limits.max_bounce_scan_bytes)
    temporary, permanent = all_failures(limited_parser(limits).parsebytes(scanned))
    findings = [
        Finding(address.decode(errors="replace").lower(), Kind.HARD_BOUNCE, "permanent failure")
        for address in sorted(permanent)
    ] + [
        Finding(address.decode(errors="replace").lower(), Kind.SOFT_BOUNCE, "temporary failure")
        for address in sorted(temporary - permanent)
    ]
    findings = [f for f in findings if "@" in f.address]
    return DeliveryReport(Source.DSN, tuple(findings)) if findings else None


def _arf(message: Message) -> DeliveryReport | None:
    feedback_type, address = "", ""
    for part in message.walk():
        content_type = part.get_content_type()
        if content_type == "message/feedback-report":
            fields = part.get_payload()
            block = fields[0] if isinstance(fields, list) and fields else part
            if not isinstance(block, Message):
                continue
            feedback_type = _field(block, "Feedback-Type").lower()
            address = address or parseaddr(_field(block, "Original-Rcpt-To"))[1].lower()
        elif content_type in ("message/rfc822", "text/rfc822-headers") and not address:
            address = _returned_recipient(part)
    if not address or feedback_type in _NOT_COMPLAINTS:
        return None
    return DeliveryReport(
        Source.ARF, (Finding(address, Kind.COMPLAINT, f"Feedback-Type {feedback_type}"),)
    )


def _returned_recipient(part: Message) -> str:
    payload = part.get_payload()
    original = payload[0] if isinstance(payload, list) and payload else None
    if not isinstance(original, Message):
        original = message_from_string(str(payload or ""))
    addresses = [a for _, a in getaddresses([str(v) for v in original.get_all("To", [])]) if a]
    return addresses[0].lower() if len(addresses) == 1 else ""


def delivery_report_record(
    *, report: DeliveryReport, raw: bytes, mail_key: str, now: datetime
) -> tuple[list[FeedbackOutcome], list[Finding]]:
    """Each finding about an address we mailed onto the suppression list (the mail key is
    the source report; `raw` is not read: the proof is where the report was sent, not what
    it quotes); returns what was recorded (a report already recorded through the
    other door is not recorded again) and the findings left out.

    A finding counts only when the report is addressed to the bounce address of a
    notification sent to that address in the last BOUNCE_REPORT_DAYS: anyone can mail a
    "bounce" to the inbound address, but only a mail system that handled the notification
    knows where its bounces go. The rest are logged and left out.
    """
    mailed = _notifications_bounced(report.addressed_to, since=now - BOUNCE_REPORT_DAYS)
    recorded, left_out = [], []
    for finding in report.findings:
        notification = mailed.get(finding.address)
        if notification is None:
            left_out.append(finding)
            continue
        outcome = feedback_record(
            address=finding.address,
            kind=finding.kind,
            source=report.source,
            report=f"inbound mail {mail_key}: {finding.detail}",
            now=now,
            event_key=feedback_event_key(
                message_id=notification.ses_message_id or f"notification:{notification.pk}",
                address=finding.address,
                kind=finding.kind,
            ),
        )
        if outcome is not None:
            recorded.append(outcome)
    if left_out:
        logger.warning(
            "report %s names %s address(es) it is not the bounce address of: not recorded",
            mail_key,
            len(left_out),
            extra={"action": "delivery_report_unverified", "mail_key": mail_key},
        )
    return recorded, left_out


def describe(report: DeliveryReport, left_out: list[Finding]) -> str:
    """The ledger row's detail: what the report said, addresses redacted."""
    return "; ".join(
        f"{finding.kind} for {redact_address(finding.address)}"
        + (
            " (not recorded: not sent to the bounce address of a mail to it)"
            if finding in left_out
            else ""
        )
        for finding in report.findings
    )[:1000]


def _notifications_bounced(
    addressed_to: tuple[str, ...], *, since: datetime
) -> dict[str, EmailNotification]:
    """recipient address (lower-cased) -> the notification sent to it (since `since`) whose
    bounce address the report was delivered to."""
    ids = {notification_id_from_bounce_address(address) for address in addressed_to} - {None}
    if not ids:
        return {}
    rows = EmailNotification.objects.filter(pk__in=ids, sent_at__gte=since).only(
        "pk", "to_address", "ses_message_id"
    )
    return {row.to_address.strip().lower(): row for row in rows if row.to_address}
