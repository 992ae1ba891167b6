"""The SES adapter: boto3 `send_raw_email` (the raw MIME carries Reply-To and List-Unsubscribe)
and `get_send_quota` (the account's rate and daily quota, for notifications/pacing.py).

Region, credentials and AWS_ENDPOINT_URL come from boto3's standard environment (SES_REGION
overrides the region, SES_CONFIGURATION_SET tags the sends; both read through
`notifications.conf`). Timeouts and retries are bounded so one send can never outlive the
claim timeout (NOTIFICATION_CLAIM_TIMEOUT_SECONDS) of the row it belongs to.

The tries are ours, not botocore's: botocore's standard mode retries SES's `Throttling`
answers too, and SES gives that code both to "Maximum sending rate exceeded" (clears in a
second: our pacing waits for a slot and tries again, no attempt spent) and to "Daily message
quota exceeded" (clears in hours: all sending pauses). Retried blindly, each throttled send
cost three calls and, when they ran out, one of the row's attempts. So botocore makes one
call, and only a lost connection or a 5xx answer is tried again here, 3 tries in all.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from notifications.conf import get_config
from notifications.senders.base import (
    MessageId,
    OutgoingEmail,
    SendError,
    SendQuota,
    SendQuotaExceeded,
    SendThrottled,
    build_message,
)

TRIES = 3  # calls per send when the connection fails or SES answers 5xx
_RETRY_PAUSE = 0.2  # seconds before the second try, doubled for the third

_CLIENT_CONFIG = Config(
    connect_timeout=5,  # seconds
    read_timeout=20,  # seconds
    retries={"total_max_attempts": 1, "mode": "standard"},  # one call: the tries are ours
)


def ses_client() -> Any:
    return boto3.session.Session().client(
        "ses", region_name=get_config().ses_region or None, config=_CLIENT_CONFIG
    )


def _refusal(exc: ClientError) -> SendError:
    """SES's answer as the SendError the delivery acts on (rate, daily quota, or other)."""
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code")), str(error.get("Message"))
    text = f"SES {code}: {message}"
    if code in ("Throttling", "ThrottlingException"):
        if "daily" in message.lower() or "quota" in message.lower():
            return SendQuotaExceeded(text)
        return SendThrottled(text)
    return SendError(text)


def _transient(exc: Exception) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return int(status) >= 500
    return False


class SesEmailSender:
    def __init__(self, client: Any | None = None, configuration_set: str | None = None) -> None:
        self._client = client if client is not None else ses_client()
        self._configuration_set = (
            get_config().ses_configuration_set if configuration_set is None else configuration_set
        )

    def _call(self, operation: str, **request: Any) -> dict[str, Any]:
        for attempt in range(1, TRIES + 1):
            try:
                return getattr(self._client, operation)(**request)
            except ClientError as exc:
                if attempt < TRIES and _transient(exc):
                    time.sleep(_RETRY_PAUSE * 2 ** (attempt - 1))
                    continue
                raise _refusal(exc) from exc
            except BotoCoreError as exc:
                if attempt < TRIES and _transient(exc):
                    time.sleep(_RETRY_PAUSE * 2 ** (attempt - 1))
                    continue
                raise SendError(f"SES {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def send(self, email: OutgoingEmail) -> MessageId:
        message, _ = build_message(email)
        request: dict[str, Any] = {
            # The envelope sender: SES sends the bounces and complaints it forwards there.
            "Source": email.envelope_from or email.from_email,
            "Destinations": [email.to],
            "RawMessage": {"Data": message.message().as_bytes()},
        }
        if self._configuration_set:
            request["ConfigurationSetName"] = self._configuration_set
        response = self._call("send_raw_email", **request)
        message_id = response.get("MessageId")
        if not message_id:
            raise SendError("SES answered without a MessageId")
        return message_id

    def send_quota(self) -> SendQuota:
        """The account's MaxSendRate and daily quota (SendError if SES cannot say)."""
        response = self._call("get_send_quota")
        try:
            return SendQuota(
                max_send_rate=float(response["MaxSendRate"]),
                max_24_hour_send=float(response["Max24HourSend"]),
                sent_last_24_hours=float(response["SentLast24Hours"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SendError(f"SES GetSendQuota answered without its figures: {exc}") from exc
