"""SES event notifications (bounce, complaint, delivery) that an operator routes through SNS to
our HTTPS endpoint (`/ses/events`, issue 23.2), checked before anything is believed.

An SNS message is believed only when
1. its TopicArn is one of SES_EVENTS_TOPIC_ARNS (without any, the endpoint is off: a valid
   signature only proves that *some* SNS topic sent it, and anyone can create a topic and
   subscribe our URL to it);
2. its SigningCertURL is https on an SNS host (`sns.<region>.amazonaws.com[.cn]`, a
   `.pem` path), so nobody can sign with a certificate of their own (the tests' local
   certificate is allowed only through SES_EVENTS_TRUSTED_CERT_URLS, a Django setting that
   project/settings.py never reads from the environment);
3. its signature verifies with that certificate's key over SNS's canonical string, with
   SHA1 (SignatureVersion 1) or SHA256 (SignatureVersion 2).

A SubscriptionConfirmation of an allowed topic is confirmed by fetching its SubscribeURL,
again only on an SNS host. A Notification's SES event becomes DeliveryFeedback through
`notifications.suppression.feedback_record`: Permanent bounce -> hard, Transient or
Undetermined -> soft, complaint -> complaint (not "not-spam"); deliveries are acknowledged.
SNS redelivers until it gets a 2xx: an SNS MessageId already recorded is not recorded again.

Written here rather than taken from django-ses: its verifier checks SignatureVersion 1
(SHA1) only, so a topic set to SignatureVersion 2 would be refused, and it brings a whole
mail backend we do not use (see the README's Libraries).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlparse
from urllib.request import urlopen

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.db import transaction

from notifications.conf import get_config
from notifications.models import DeliveryFeedback
from notifications.suppression import feedback_record

logger = logging.getLogger(__name__)

Kind = DeliveryFeedback.Kind

SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
_FETCH_TIMEOUT = 10  # seconds
_MAX_CERT_BYTES = 64 * 1024
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
_certificates: dict[str, x509.Certificate] = {}
_lock = threading.Lock()


class Refused(Exception):
    """The message is not believed; the text says why (logged, and the HTTP status)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def topic_arns() -> tuple[str, ...]:
    return get_config().ses_events_topic_arns


def _on_sns_host(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme == "https" and bool(SNS_HOST.match(parsed.hostname or ""))


def _certificate(url: str) -> x509.Certificate:
    trusted = get_config().ses_events_trusted_cert_urls
    if url not in trusted and not (_on_sns_host(url) and urlparse(url).path.endswith(".pem")):
        raise Refused(400, f"signing certificate not from an SNS host: {url[:200]!r}")
    with _lock:
        cached = _certificates.get(url)
    if cached is not None:
        return cached
    try:
        with urlopen(url, timeout=_FETCH_TIMEOUT) as response:  # noqa: S310 - checked above
            pem = response.read(_MAX_CERT_BYTES + 1)
        if len(pem) > _MAX_CERT_BYTES:
            raise Refused(400, "signing certificate too large")
        certificate = x509.load_pem_x509_certificate(pem)
    except (OSError, ValueError) as exc:
        # SNS retries: a certificate we could not fetch now is tried again then.
        raise Refused(503, f"signing certificate unavailable: {exc}") from exc
    with _lock:
        _certificates[url] = certificate
    return certificate


def _string_to_sign(message: dict[str, Any]) -> bytes:
    fields = _SIGNED_FIELDS.get(str(message.get("Type")))
    if fields is None:
        raise Refused(400, f"unknown SNS message type {message.get('Type')!r}")
    return "".join(
        f"{name}\n{message[name]}\n" for name in fields if message.get(name) is not None
    ).encode()


def verify(message: dict[str, Any]) -> None:
    """Refused unless the message comes from an allowed topic and its signature holds."""
    if message.get("TopicArn") not in topic_arns():
        raise Refused(403, f"topic not allowed: {str(message.get('TopicArn'))[:200]!r}")
    version = str(message.get("SignatureVersion"))
    algorithm = {"1": hashes.SHA1(), "2": hashes.SHA256()}.get(version)  # noqa: S303 - SNS v1
    if algorithm is None:
        raise Refused(400, f"unknown SignatureVersion {version!r}")
    try:
        signature = base64.b64decode(str(message.get("Signature", "")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Refused(400, "signature is not base64") from exc
    key = _certificate(str(message.get("SigningCertURL", ""))).public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise Refused(400, "signing certificate has no RSA key")
    try:
        key.verify(signature, _string_to_sign(message), padding.PKCS1v15(), algorithm)
    except InvalidSignature as exc:
        raise Refused(400, "signature does not verify") from exc


@dataclass(frozen=True)
class Handled:
    what: str  # subscription_confirmed, feedback, delivery, duplicate, ignored
    recorded: int = 0


def handle(message: dict[str, Any], *, now: datetime) -> Handled:
    """Act on a verified SNS message."""
    kind = message.get("Type")
    if kind == "SubscriptionConfirmation":
        url = str(message.get("SubscribeURL", ""))
        if not _on_sns_host(url):
            raise Refused(400, "SubscribeURL not on an SNS host")
        with urlopen(url, timeout=_FETCH_TIMEOUT) as response:  # noqa: S310 - checked above
            response.read(_MAX_CERT_BYTES)
        logger.info(
            "SNS subscription confirmed for %s",
            message.get("TopicArn"),
            extra={"action": "ses_events_subscribed"},
        )
        return Handled("subscription_confirmed")
    if kind != "Notification":
        return Handled("ignored")
    try:
        event = json.loads(str(message.get("Message", "")))
    except ValueError as exc:
        raise Refused(400, "the SES event is not JSON") from exc
    if not isinstance(event, dict):
        raise Refused(400, "the SES event is not an object")
    source_ref = f"SNS {message.get('MessageId')}"
    with transaction.atomic():
        if DeliveryFeedback.objects.filter(report__startswith=source_ref + ":").exists():
            return Handled("duplicate")
        findings = _findings(event)
        for address, feedback_kind, detail in findings:
            feedback_record(
                address=address,
                kind=feedback_kind,
                source=DeliveryFeedback.Source.SES_EVENT,
                report=f"{source_ref}: {detail}",
                now=now,
            )
    event_type = event.get("eventType") or event.get("notificationType")
    return Handled("feedback" if findings else str(event_type or "ignored").lower(), len(findings))


def _findings(event: dict[str, Any]) -> list[tuple[str, str, str]]:
    event_type = event.get("eventType") or event.get("notificationType")
    mail_id = (event.get("mail") or {}).get("messageId", "")
    if event_type == "Bounce":
        bounce = event.get("bounce") or {}
        bounce_type = str(bounce.get("bounceType", ""))
        kind = Kind.HARD_BOUNCE if bounce_type == "Permanent" else Kind.SOFT_BOUNCE
        return [
            (
                str(r.get("emailAddress", "")),
                kind,
                f"{bounce_type}/{bounce.get('bounceSubType', '')} of SES message {mail_id}; "
                f"{r.get('status', '')} {r.get('diagnosticCode', '')}".strip(),
            )
            for r in bounce.get("bouncedRecipients") or []
            if "@" in str(r.get("emailAddress", ""))
        ]
    if event_type == "Complaint":
        complaint = event.get("complaint") or {}
        feedback_type = str(complaint.get("complaintFeedbackType", "abuse"))
        if feedback_type == "not-spam":
            return []
        return [
            (str(r.get("emailAddress", "")), Kind.COMPLAINT, f"{feedback_type} on {mail_id}")
            for r in complaint.get("complainedRecipients") or []
            if "@" in str(r.get("emailAddress", ""))
        ]
    return []
