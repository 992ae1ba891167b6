"""The acceptance policy: does a parsed reply count, and if not, why not.

Pure: a parsed mail plus a snapshot of the notification it answers go in, an `Accept` or a
`Reject(reason, detail)` comes out. No database, no store, no clock (the caller passes `now`),
so every branch is testable without rows and the policy reads top to bottom in one place. The
caller (`intake`) loads the snapshot under the notification's row lock and carries out the
decision.

Check order: auto-reply → token → sender → unsubscribe → expiry / status → proposal → rate
limit → content. Unsubscribe comes before expiry so that an old notification's
List-Unsubscribe still works; it still needs a known token and the notified sender.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from inbound_email.models import InboundEmail
from inbound_email.parsing import ParsedMail
from inbound_email.replies import ReplyContent, auto_reply_reason, split_reply
from inbound_email.verdicts import FAIL, PASS, SesVerdicts
from notifications.selectors import notification_has_expired, notification_is_open_for_replies
from project.redaction import redact_address

Reason = InboundEmail.Reason

_UNSUBSCRIBE_SUBJECT_RE = re.compile(r"^\s*(?:(?:re|aw|fwd?)\s*:\s*)*unsubscribe\s*$", re.I)


@dataclass(frozen=True)
class NotificationSnapshot:
    """What the policy needs to know about the answered notification, read under its lock."""

    to_address: str
    status: str
    expires_at: datetime | None
    has_proposal: bool
    replies_last_hour: int  # replies recorded for it in the hour before `now`


@dataclass(frozen=True)
class Accept:
    """The mail counts: an unsubscribe request, or a reply with a rating and/or instruction."""

    content: ReplyContent | None = None  # None for an unsubscribe
    unsubscribe: bool = False


@dataclass(frozen=True)
class Reject:
    reason: str  # an InboundEmail.Reason
    detail: str  # shown to operators; addresses redacted


@dataclass(frozen=True)
class Quarantine:
    """Kept aside for an operator, never acted on (not a reply that merely does not count)."""

    reason: str  # an InboundEmail.Reason
    detail: str


Decision = Accept | Reject


def screen_ses_verdicts(
    verdicts: SesVerdicts, *, auth_results_dmarc: str = ""
) -> Reject | Quarantine | None:
    """What SES's verdicts say about the mail, before anything else is looked at.

    A virus FAIL is quarantined (kept for an operator, whatever else the mail is). DMARC
    decides whether the From is authentic when it has a verdict (PASS means an aligned SPF or
    DKIM pass, so a PASS accepts even if one of them failed); a `dmarc=fail` in the receiving
    host's topmost Authentication-Results (`auth_results_dmarc`, `verdicts.py`) rejects the
    same way. Without a DMARC verdict (absent, GRAY = the domain publishes no policy,
    PROCESSING_FAILED, unreadable) the mail is rejected only when SPF *and* DKIM both failed:
    one failing alone is common for genuine mail (forwarding breaks SPF, mailing lists break
    DKIM). A spam verdict FAIL rejects (issue 21): what SES scores as spam is not acted on
    as a PI's instruction; the raw source is kept for an operator who thinks otherwise. No
    verdicts at all: nothing to go on, the usual checks decide. None of these rejections
    earns a notice (the From may be forged).
    """
    if verdicts.virus == FAIL:
        return Quarantine(Reason.VIRUS, verdicts.describe("virus"))
    if verdicts.dmarc == FAIL:
        return Reject(Reason.UNAUTHENTICATED_SENDER, "DMARC failed: " + verdicts.describe("dmarc"))
    if auth_results_dmarc == "fail":
        return Reject(
            Reason.UNAUTHENTICATED_SENDER,
            "DMARC failed: dmarc=fail in the receiving host's Authentication-Results",
        )
    if verdicts.dmarc != PASS and verdicts.spf == FAIL and verdicts.dkim == FAIL:
        return Reject(
            Reason.UNAUTHENTICATED_SENDER,
            "SPF and DKIM failed, no DMARC verdict: " + verdicts.describe("spf", "dkim", "dmarc"),
        )
    if verdicts.spam == FAIL:
        return Reject(Reason.SPAM, "SES scored it as spam: " + verdicts.describe("spam"))
    return None


def is_unsubscribe(mail: ParsedMail) -> bool:
    """The List-Unsubscribe mailto (subject "unsubscribe", also as "Re:"/"AW:"/"Fwd:" reply)
    or a reply whose first non-empty line says just "unsubscribe"."""
    if _UNSUBSCRIBE_SUBJECT_RE.match(mail.subject):
        return True
    first = next((line.strip() for line in mail.reply_text.splitlines() if line.strip()), "")
    return first.lower() == "unsubscribe"


def screen(mail: ParsedMail) -> Reject | None:
    """What can be decided from the mail alone (auto-replies and bounces never count). The
    intake asks this before it locks a notification, so such mail touches none."""
    auto = auto_reply_reason(mail)
    return None if auto is None else Reject(Reason(auto[0]), auto[1])


def decide(
    *,
    mail: ParsedMail,
    token: str,
    notification: NotificationSnapshot | None,
    now: datetime,
    max_replies_per_hour: int,
) -> Decision:
    """Accept or reject a (non-duplicate) reply. `token` is the reply token seen in the mail
    ("" when none); `notification` the notification it names (None when unknown)."""
    screened = screen(mail)
    if screened is not None:
        return screened
    if not token:
        return Reject(Reason.NO_TOKEN, "no reply token in the recipients or In-Reply-To")
    if notification is None:
        return Reject(Reason.UNKNOWN_TOKEN, "the token matches no notification")
    expected = (notification.to_address or "").strip().lower()
    if mail.from_count != 1 or not expected or mail.from_address != expected:
        return Reject(
            Reason.SENDER_MISMATCH,
            f"from {redact_address(mail.from_address)} ({mail.from_count} From addresses), "
            f"notification went to {redact_address(expected)}",
        )
    if is_unsubscribe(mail):
        # A request, not an instruction; honoured also once the notification has expired.
        return Accept(unsubscribe=True)
    if notification_has_expired(notification=notification, now=now):
        return Reject(Reason.EXPIRED_TOKEN, f"expired at {notification.expires_at}")
    if not notification_is_open_for_replies(notification=notification, now=now):
        return Reject(Reason.TOKEN_NOT_OPEN, f"notification is {notification.status}")
    if not notification.has_proposal:
        # A digest: an instruction could reach no conversation (the raw mail is kept).
        return Reject(Reason.NO_PROPOSAL, "instructions must answer a proposal's email")
    recent = notification.replies_last_hour
    if recent >= max_replies_per_hour:
        return Reject(
            Reason.RATE_LIMITED,
            f"{recent} replies in the last hour (limit {max_replies_per_hour})",
        )
    content = split_reply(mail.reply_text)
    if content.rating is None and not content.instruction:
        if content.rating_error:
            return Reject(Reason.INVALID_RATING, content.rating_error)
        return Reject(Reason.EMPTY_REPLY, "no rating and no instruction in the reply")
    return Accept(content=content)
