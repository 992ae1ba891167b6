"""The sender interface every notification sender implements, and the types it speaks in.

A sender takes an OutgoingEmail and returns the message id the mail service gave the accepted
message, or raises SendError. A row becomes `sent` only with that id (I12). The adapters are
`django.py` (Django's EMAIL_BACKEND) and `ses.py` (boto3 SES); EMAIL_SENDER picks one (see
`notifications.senders.get_sender`). This module imports neither of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.utils import make_msgid, parseaddr
from typing import Protocol

from django.core.mail import EmailMultiAlternatives

from notifications.exceptions import NotificationError

MessageId = str  # the id the mail service gave an accepted message, without angle brackets


class SendError(NotificationError):
    """The mail service did not accept a message; the row goes back to pending (or failed)."""


class SendThrottled(SendError):
    """Refused for the sending rate ("Maximum sending rate exceeded"): a limit that clears in
    a second. Not an attempt: the send is tried again after a short delay."""


class SendQuotaExceeded(SendError):
    """Refused for the daily quota ("Daily message quota exceeded"): nothing can be sent until
    the quota frees. Not an attempt: all sending pauses (notifications/pacing.py)."""


@dataclass(frozen=True)
class SendQuota:
    """The account's limits as the mail service reports them (SES GetSendQuota)."""

    max_send_rate: float  # mails per second
    max_24_hour_send: float  # the daily quota; negative: unlimited
    sent_last_24_hours: float

    @property
    def exhausted(self) -> bool:
        return 0 <= self.max_24_hour_send <= self.sent_last_24_hours


@dataclass(frozen=True)
class OutgoingEmail:
    to: str
    subject: str
    text: str
    html: str
    reply_to: str
    from_email: str
    headers: dict[str, str] = field(default_factory=dict)
    # The envelope sender (SMTP MAIL FROM / SES Source) where bounces go; empty: from_email.
    # Never written into the message (notifications/bounce_address.py).
    envelope_from: str = ""


class EmailSender(Protocol):
    """What a sweep needs of a sender. Built with no arguments from EMAIL_SENDER."""

    def send(self, email: OutgoingEmail) -> MessageId:
        """Hand the message over; return its message id; raise SendError if not accepted."""
        ...


# A sender may also have `send_quota() -> SendQuota | None` (the SES one does): the account's
# rate and daily quota. A sender without it is paced only by NOTIFICATION_SEND_RATE.


def _message_id_domain(from_email: str) -> str:
    # make_msgid() without a domain does a DNS lookup of this host's FQDN: slow and useless.
    address = parseaddr(from_email)[1]
    return address.rpartition("@")[2] or "localhost"


def build_message(email: OutgoingEmail) -> tuple[EmailMultiAlternatives, MessageId]:
    """The MIME message (text + HTML alternative) and its Message-ID without angle brackets.

    Shared by both adapters so a notification looks the same whichever service sends it.
    """
    message_id = make_msgid(domain=_message_id_domain(email.from_email))
    message = EmailMultiAlternatives(
        subject=email.subject,
        body=email.text,
        # Django's backends use from_email as the envelope sender; the From header is ours.
        from_email=email.envelope_from or email.from_email,
        to=[email.to],
        reply_to=[email.reply_to],
        headers={**email.headers, "From": email.from_email, "Message-ID": message_id},
    )
    message.attach_alternative(email.html, "text/html")
    return message, message_id.strip("<>")
