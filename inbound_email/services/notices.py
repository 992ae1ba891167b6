"""Which rejected replies earn the PI a word back (issue 13), and asking for it.

A PI whose reply was rejected for a reason they can fix (or should know about) never learnt
it. These reasons get a notice: an invalid rating, an empty reply, an expired token, the rate
limit, a reply to a digest. Never for mail that is not the PI's own answer to a known
notification: an auto-reply or a bounce (a notice would answer a robot, or loop), a sender
mismatch or an unknown token (the notice would go to, or about, someone else), a failed
DMARC / SPF check (a forgery), a quarantined mail; those are all decided before a
notification is in hand, or here by the reason.

The notice itself (its row, the hourly cap, its sending) is the notifications app's
(`notifications.notices`); the intake calls this in the transaction that records the
rejection, holding the notification's row lock.
"""

from __future__ import annotations

from datetime import datetime

from inbound_email.models import InboundEmail
from notifications.models import EmailNotification
from notifications.notices import notice_reply_rejected

Reason = InboundEmail.Reason

NOTICE_REASONS = frozenset(
    {
        Reason.INVALID_RATING,
        Reason.EMPTY_REPLY,
        Reason.EXPIRED_TOKEN,
        Reason.RATE_LIMITED,
        Reason.NO_PROPOSAL,
    }
)


def rejection_notice(
    *, notification: EmailNotification, reason: str, now: datetime
) -> EmailNotification | None:
    """The notice queued for this rejection, or None (a reason without one, a notice about a
    notice, or one already sent for this notification within the hour)."""
    if reason not in NOTICE_REASONS or notification.kind == EmailNotification.Kind.REPLY_REJECTED:
        return None
    return notice_reply_rejected(about=notification, reason=str(reason), now=now)
