"""SES through moto: what the notification tests read back (sent messages, recipients)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

REGION = "us-east-1"


SENDER_ADDRESS = "assistant@localhost"  # DEFAULT_FROM_EMAIL's address


@dataclass
class MotoSes:
    client: Any

    def verify_sender(self) -> None:
        self.client.verify_email_identity(EmailAddress=SENDER_ADDRESS)

    @property
    def messages(self) -> list[Any]:
        return list(ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages)

    def recipients(self) -> list[str]:
        """One entry per accepted message: its envelope recipient."""
        return [message.destinations[0] for message in self.messages]
