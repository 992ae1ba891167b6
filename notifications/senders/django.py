"""The sender that hands mail to Django's EMAIL_BACKEND (console on the embedded default,
locmem in tests, SMTP or any other backend in production).

The console/file/SMTP backends give no message id of their own, so this sender sets the
Message-ID header itself and returns it: a row is `sent` only with an id (I12).
"""

from __future__ import annotations

import smtplib

from notifications.senders.base import MessageId, OutgoingEmail, SendError, build_message


class DjangoEmailSender:
    def send(self, email: OutgoingEmail) -> MessageId:
        message, message_id = build_message(email)
        try:
            accepted = message.send(fail_silently=False)
        except (smtplib.SMTPException, OSError) as exc:
            raise SendError(f"{type(exc).__name__}: {exc}") from exc
        if accepted != 1:
            raise SendError("the email backend accepted no message")
        return message_id
