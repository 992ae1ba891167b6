"""The SES adapter: boto3 `send_raw_email` (the raw MIME carries Reply-To and List-Unsubscribe).

Region, credentials and AWS_ENDPOINT_URL come from boto3's standard environment (SES_REGION
overrides the region, SES_CONFIGURATION_SET tags the sends; both read through
`notifications.conf`). Timeouts and retries are bounded so one send can never outlive the
claim timeout (NOTIFICATION_CLAIM_TIMEOUT_SECONDS) of the row it belongs to.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from notifications.conf import get_config
from notifications.senders.base import MessageId, OutgoingEmail, SendError, build_message

_CLIENT_CONFIG = Config(
    connect_timeout=5,  # seconds
    read_timeout=20,  # seconds
    retries={"total_max_attempts": 3, "mode": "standard"},  # tries in all
)


def ses_client() -> Any:
    return boto3.session.Session().client(
        "ses", region_name=get_config().ses_region or None, config=_CLIENT_CONFIG
    )


class SesEmailSender:
    def __init__(self, client: Any | None = None, configuration_set: str | None = None) -> None:
        self._client = client if client is not None else ses_client()
        self._configuration_set = (
            get_config().ses_configuration_set if configuration_set is None else configuration_set
        )

    def send(self, email: OutgoingEmail) -> MessageId:
        message, _ = build_message(email)
        request: dict[str, Any] = {
            "Source": email.from_email,
            "Destinations": [email.to],
            "RawMessage": {"Data": message.message().as_bytes()},
        }
        if self._configuration_set:
            request["ConfigurationSetName"] = self._configuration_set
        try:
            response = self._client.send_raw_email(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise SendError(f"SES {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise SendError(f"SES {type(exc).__name__}: {exc}") from exc
        message_id = response.get("MessageId")
        if not message_id:
            raise SendError("SES answered without a MessageId")
        return message_id
