"""SES through moto: what the notification tests read back (sent messages, recipients)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

REGION = "us-east-1"


SENDER_ADDRESS = "assistant@localhost"  # DEFAULT_FROM_EMAIL's address
REPLY_DOMAIN = "reply.localhost"  # INBOUND_REPLY_ADDRESS's domain: the bounce addresses


@dataclass
class MotoSes:
    client: Any

    def verify_sender(self) -> None:
        self.client.verify_email_identity(EmailAddress=SENDER_ADDRESS)
        # The envelope sender (Source) is a bounce address on the reply domain (issue 28.5).
        self.client.verify_domain_identity(Domain=REPLY_DOMAIN)

    @property
    def messages(self) -> list[Any]:
        return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)

    def recipients(self) -> list[str]:
        """One entry per accepted message: its envelope recipient."""
        return [message.destinations[0] for message in self.messages]
