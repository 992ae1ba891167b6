"""Sample PI replies to a notification, as a mail client (or a broken one) would send them.

Used by the demo and the system test, so both feed the poller the same realistic mail.
"""

from __future__ import annotations

from email.message import EmailMessage

from notifications.models import EmailNotification
from notifications.reply_address import reply_address_for


def reply_mail(
    notification: EmailNotification, body: str, *, message_id: str, **headers: str
) -> bytes:
    """A reply from the notified address (override with From=...), extra headers as given."""
    message = EmailMessage()
    message["From"] = headers.pop("From", notification.to_address)
    message["To"] = reply_address_for(notification.token)
    message["Subject"] = "Re: your proposal"
    message["Message-ID"] = f"<{message_id}@example.org>"
    for name, value in headers.items():
        message[name] = value
    message.set_content(body)
    return bytes(message)


def unknown_8bit_reply(notification: EmailNotification, body: str, *, message_id: str) -> bytes:
    """The report's first poison pill: 8-bit text declared as charset=unknown-8bit."""
    head = (
        f"From: {notification.to_address}\r\nTo: {reply_address_for(notification.token)}\r\n"
        f"Subject: Re: proposal\r\nMessage-ID: <{message_id}@example.org>\r\n"
        "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=unknown-8bit\r\n"
        "Content-Transfer-Encoding: 8bit\r\n\r\n"
    )
    return head.encode("ascii") + body.replace("\n", "\r\n").encode("cp1252")
