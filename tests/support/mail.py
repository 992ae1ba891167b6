"""Mail as a PI's client would send it: the raw bytes the inbound tests put in a store."""

from __future__ import annotations

from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from django.utils import timezone

from notifications.reply_address import reply_address_for

PI_ADDRESS = "pi@university.example"


def build_mail(
    *,
    token: str | None = None,
    sender: str = PI_ADDRESS,
    body: str = "4\nPlease tighten the budget section.",
    subject: str = "Re: Your proposal",
    headers: dict[str, str] | None = None,
    message_id: str | None = None,
    to: str | None = None,
) -> bytes:
    """A reply as a PI's mail client would send it, as raw bytes."""
    msg = EmailMessage()
    msg["From"] = f"Ada Lovelace <{sender}>"
    msg["To"] = to or (reply_address_for(token) if token else "replies@reply.localhost")
    msg["Subject"] = subject
    msg["Date"] = format_datetime(timezone.now())
    msg["Message-ID"] = message_id or make_msgid(domain="university.example")
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(
        body + "\n\nOn Mon, 1 Dec 2026, Assistant wrote:\n> Please rate this proposal\n"
    )
    return msg.as_bytes()
