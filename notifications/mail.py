"""One sender interface, two adapters: Django's email backend here, SES in `ses.py`.

A sender returns the message id the service gave the accepted message, or raises SendError.
A row becomes `sent` only with that id (I12), so the Django adapter sets its own Message-ID
header and returns it: the console/file/SMTP backends give no id of their own.
"""

from __future__ import annotations

import smtplib
from dataclasses import dataclass, field
from email.utils import make_msgid, parseaddr
from typing import Protocol

from django.conf import settings
from django.core.mail import EmailMultiAlternatives

from notifications.exceptions import SendError


@dataclass(frozen=True)
class OutgoingEmail:
    to: str
    subject: str
    text: str
    html: str
    reply_to: str
    from_email: str
    headers: dict[str, str] = field(default_factory=dict)


class EmailSender(Protocol):
    def send(self, email: OutgoingEmail) -> str:
        """Hand the message over; return its message id; raise SendError if not accepted."""
        ...


def _message_id_domain(from_email: str) -> str:
    # make_msgid() without a domain does a DNS lookup of this host's FQDN: slow and useless.
    address = parseaddr(from_email)[1]
    return address.rpartition("@")[2] or "localhost"


def build_message(email: OutgoingEmail) -> tuple[EmailMultiAlternatives, str]:
    """The MIME message (text + HTML alternative) and its Message-ID without angle brackets."""
    message_id = make_msgid(domain=_message_id_domain(email.from_email))
    message = EmailMultiAlternatives(
        subject=email.subject,
        body=email.text,
        from_email=email.from_email,
        to=[email.to],
        reply_to=[email.reply_to],
        headers={**email.headers, "Message-ID": message_id},
    )
    message.attach_alternative(email.html, "text/html")
    return message, message_id.strip("<>")


class DjangoEmailSender:
    """Sends through settings.EMAIL_BACKEND (console on the embedded default, locmem in tests)."""

    def send(self, email: OutgoingEmail) -> str:
        message, message_id = build_message(email)
        try:
            accepted = message.send(fail_silently=False)
        except (smtplib.SMTPException, OSError) as exc:
            raise SendError(f"{type(exc).__name__}: {exc}") from exc
        if accepted != 1:
            raise SendError("the email backend accepted no message")
        return message_id


def get_sender() -> EmailSender:
    """The sender chosen by settings.EMAIL_SENDER; built per sweep (cheap, and fork-safe)."""
    if settings.EMAIL_SENDER == "ses":
        from notifications.ses import SesEmailSender

        return SesEmailSender()
    return DjangoEmailSender()
