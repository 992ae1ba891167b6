"""SES event notifications (bounce, complaint, delivery) that an operator routes through SNS to
our HTTPS endpoint (`/ses/events`, issue 23.2), checked before anything is believed.

An SNS message is believed only when
1. its TopicArn is one of SES_EVENTS_TOPIC_ARNS (without any, the endpoint is off: a valid
   signature only proves that *some* SNS topic sent it, and anyone can create a topic and
   subscribe our URL to it);
2. its SigningCertURL is https on an SNS endpoint of a real region (`sns_certificates.py`:
   never an S3 bucket host; fetched within a deadline, cached, failures too), so nobody can
   sign with a certificate of their own (the tests' local certificate is allowed only
   through SES_EVENTS_TRUSTED_CERT_URLS, a Django setting that project/settings.py never
   reads from the environment);
3. its signature verifies with that certificate's key over SNS's canonical string, with
   SHA1 (SignatureVersion 1) or SHA256 (SignatureVersion 2).

Anything else (issue 28.4) is a 400 with the reason: a body that is too big, not UTF-8, not
JSON, nested past Python's recursion limit, not an object of strings; an SES event of a shape
SES does not write. A fetch that fails (certificate, SubscribeURL) is a 503: SNS retries.

A SubscriptionConfirmation of an allowed topic is confirmed by fetching its SubscribeURL,
again only on an SNS endpoint, within the same deadline. A Notification's SES event becomes
DeliveryFeedback through `notifications.suppression.feedback_record`: Permanent bounce ->
hard, Transient or Undetermined -> soft, complaint -> complaint (not "not-spam"); deliveries
are acknowledged.
SNS redelivers until it gets a 2xx, and does so while a slow first delivery is still
running: each finding carries an event key (the bounced SES message, the recipient, the
kind) that DeliveryFeedback holds unique, so any number of concurrent deliveries of one SNS
message record it once, and a DSN about the same message (inbound_email) adds nothing.

Written here rather than taken from django-ses: its verifier checks SignatureVersion 1
(SHA1) only, so a topic set to SignatureVersion 2 would be refused, and it brings a whole
mail backend we do not use (see the README's Libraries).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.db import transaction

from notifications.bounded_fetch import FetchFailed, fetch
from notifications.conf import get_config
from notifications.exceptions import SnsMessageRefused
from notifications.models import DeliveryFeedback
from notifications.sns_certificates import on_sns_endpoint, signing_certificate
from notifications.suppression import feedback_event_key, feedback_record

logger = logging.getLogger(__name__)

Kind = DeliveryFeedback.Kind
Refused = SnsMessageRefused  # the name the views and tests know

_SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
}
_SIGNED_FIELDS["UnsubscribeConfirmation"] = _SIGNED_FIELDS["SubscriptionConfirmation"]
_MAX_ADDRESS = 320  # DeliveryFeedback.address
_MAX_MESSAGE_ID = 200  # EmailNotification.ses_message_id
_SUBSCRIBE_PATH = r"/"
_MAX_SUBSCRIBE_ANSWER = 64 * 1024


def topic_arns() -> tuple[str, ...]:
    return get_config().ses_events_topic_arns


def parse_message(body: bytes) -> dict[str, Any]:
    """The SNS envelope: a JSON object of strings (what SNS posts; MessageAttributes, unsigned
    and unused here, may be an object), or Refused(400)."""
    if len(body) > get_config().ses_events_max_body_bytes:
        raise Refused(400, "body too large for an SNS message")
    try:
        text = body.decode("utf-8")
        message = json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise Refused(400, "body is not UTF-8") from exc
    except RecursionError as exc:  # "[" * 100000: nested past the interpreter's limit
        raise Refused(400, "body is nested too deeply to be an SNS message") from exc
    except ValueError as exc:
        raise Refused(400, "body is not JSON") from exc
    if not isinstance(message, dict):
        raise Refused(400, "body is not an SNS message (a JSON object)")
    for name, value in message.items():
        if name == "MessageAttributes" and isinstance(value, dict):
            continue
        if not isinstance(value, str):
            raise Refused(400, f"field {name[:50]!r} of the SNS message is not a string")
        if not _storable(value):
            raise Refused(400, f"field {name[:50]!r} holds a NUL or a lone surrogate")
    return message


def _storable(text: str) -> bool:
    """No NUL (PostgreSQL's text refuses it) and no lone surrogate (not encodable)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def verify(message: dict[str, Any]) -> None:
    """Refused unless the message comes from an allowed topic and its signature holds. The
    cheap checks come first: only a message that passes them may cost a certificate fetch."""
    if message.get("TopicArn") not in topic_arns():
        raise Refused(403, f"topic not allowed: {str(message.get('TopicArn'))[:200]!r}")
    fields = _SIGNED_FIELDS.get(message.get("Type", ""))
    if fields is None:
        raise Refused(400, f"unknown SNS message type {str(message.get('Type'))[:50]!r}")
    version = message.get("SignatureVersion")
    algorithm = {"1": hashes.SHA1(), "2": hashes.SHA256()}.get(str(version))  # noqa: S303
    if algorithm is None:
        raise Refused(400, f"unknown SignatureVersion {str(version)[:20]!r}")
    try:
        signature = base64.b64decode(message.get("Signature", ""), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Refused(400, "signature is not base64") from exc
    if not signature:
        raise Refused(400, "no signature")
    key = signing_certificate(message.get("SigningCertURL", "")).public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise Refused(400, "signing certificate has no RSA key")
    text = "".join(f"{name}\n{message[name]}\n" for name in fields if name in message)
    try:
        key.verify(signature, text.encode(), padding.PKCS1v15(), algorithm)
    except InvalidSignature as exc:
        raise Refused(400, "signature does not verify") from exc


@dataclass(frozen=True)
class Handled:
    what: str  # subscription_confirmed, feedback, duplicate, delivery, ..., ignored
    recorded: int = 0


def handle(message: dict[str, Any], *, now: datetime) -> Handled:
    """Act on a verified SNS message."""
    kind = message.get("Type")
    if kind == "SubscriptionConfirmation":
        _confirm_subscription(message)
        return Handled("subscription_confirmed")
    if kind != "Notification":
        return Handled("ignored")
    try:
        event = json.loads(message.get("Message", ""), parse_constant=_no_constant)
    except RecursionError as exc:
        raise Refused(400, "the SES event is nested too deeply") from exc
    except ValueError as exc:
        raise Refused(400, "the SES event is not JSON") from exc
    findings = _findings(event)
    recorded = 0
    with transaction.atomic():
        for address, feedback_kind, mail_id, detail in findings:
            outcome = feedback_record(
                address=address,
                kind=feedback_kind,
                source=DeliveryFeedback.Source.SES_EVENT,
                report=f"SNS {message.get('MessageId', '')[:100]}: {detail}",
                now=now,
                event_key=feedback_event_key(
                    message_id=mail_id or f"sns:{message.get('MessageId', '')[:100]}",
                    address=address,
                    kind=feedback_kind,
                ),
            )
            recorded += outcome is not None
    if findings:
        return Handled("feedback" if recorded else "duplicate", recorded)
    return Handled(str(_event_type(event) or "ignored").lower()[:50])


def _confirm_subscription(message: dict[str, Any]) -> None:
    url = message.get("SubscribeURL", "")
    if url not in get_config().ses_events_trusted_subscribe_urls and not on_sns_endpoint(
        url, path=_SUBSCRIBE_PATH
    ):
        raise Refused(400, "SubscribeURL not on an SNS endpoint")
    try:
        fetch(
            url,
            deadline_seconds=get_config().ses_events_fetch_deadline_seconds,
            max_bytes=_MAX_SUBSCRIBE_ANSWER,
        )
    except FetchFailed as exc:
        # SNS sends the confirmation again; an operator can also confirm it in the console.
        raise Refused(503, f"SubscribeURL could not be fetched: {exc}") from exc
    logger.info(
        "SNS subscription confirmed for %s",
        message.get("TopicArn"),
        extra={"action": "ses_events_subscribed"},
    )


def _event_type(event: dict[str, Any]) -> str:
    value = event.get("eventType", event.get("notificationType", ""))
    if not isinstance(value, str):
        raise Refused(400, "the SES event's type is not a string")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused(400, f"the SES event's {what} is not an object")
    return value


def _text(value: Any, what: str, *, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or not _storable(value):
        raise Refused(400, f"the SES event's {what} is not a string of at most {limit}")
    return value


def _recipients(container: dict[str, Any], name: str) -> list[tuple[str, dict[str, Any]]]:
    """(address, recipient object) of `bouncedRecipients` / `complainedRecipients`."""
    value = container.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refused(400, f"the SES event's {name} is not a list")
    recipients = []
    for item in value:
        recipient = _object(item, name[:-1])
        address = _text(recipient.get("emailAddress"), "emailAddress", limit=_MAX_ADDRESS)
        if "@" in address:
            recipients.append((address, recipient))
    return recipients


def _findings(event: Any) -> list[tuple[str, str, str, str]]:
    """(address, kind, bounced SES message id, detail) for each bounced or complaining
    recipient; Refused(400) for an event of a shape SES does not write."""
    if not isinstance(event, dict):
        raise Refused(400, "the SES event is not an object")
    event_type = _event_type(event)
    mail = _object(event.get("mail"), "mail")
    mail_id = _text(mail.get("messageId"), "mail.messageId", limit=_MAX_MESSAGE_ID)
    if event_type == "Bounce":
        bounce = _object(event.get("bounce"), "bounce")
        bounce_type = _text(bounce.get("bounceType"), "bounceType", limit=50)
        sub_type = _text(bounce.get("bounceSubType"), "bounceSubType", limit=50)
        kind = Kind.HARD_BOUNCE if bounce_type == "Permanent" else Kind.SOFT_BOUNCE
        return [
            (
                address,
                kind,
                mail_id,
                f"{bounce_type}/{sub_type} of SES message {mail_id}; "
                f"{_text(r.get('status'), 'status', limit=100)} "
                f"{_text(r.get('diagnosticCode'), 'diagnosticCode', limit=2000)}".strip(),
            )
            for address, r in _recipients(bounce, "bouncedRecipients")
        ]
    if event_type == "Complaint":
        complaint = _object(event.get("complaint"), "complaint")
        feedback_type = (
            _text(complaint.get("complaintFeedbackType"), "complaintFeedbackType", limit=50)
            or "abuse"
        )
        addresses = _recipients(complaint, "complainedRecipients")
        if feedback_type == "not-spam":
            return []
        return [
            (address, Kind.COMPLAINT, mail_id, f"{feedback_type} on {mail_id}")
            for address, _ in addresses
        ]
    return []
