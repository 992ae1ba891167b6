"""A local SNS signer: a test certificate (made here, self-signed), served over HTTP on
127.0.0.1 the way SNS serves its signing certificate, and messages signed with its key the way
SNS signs them (SignatureVersion 1: SHA1, 2: SHA256, over the canonical string).

The endpoint accepts the certificate's URL only through SES_EVENTS_TRUSTED_CERT_URLS (a
Django setting the environment never sets): `settings.SES_EVENTS_TRUSTED_CERT_URLS =
[signer.cert_url]`.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

TOPIC = "arn:aws:sns:us-east-1:123456789012:ses-events"

_FIELDS = {
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


class SnsSigner:
    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.us-east-1.amazonaws.com")])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        self.pem = cert.public_bytes(serialization.Encoding.PEM)
        self.fetches = 0
        signer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                signer.fetches += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-pem-file")
                self.send_header("Content-Length", str(len(signer.pem)))
                self.end_headers()
                self.wfile.write(signer.pem)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def cert_url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}/SimpleNotificationService-test.pem"

    def __enter__(self) -> SnsSigner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def notification(
        self, event: dict[str, Any], *, version: str = "1", topic: str = TOPIC, **overrides: Any
    ) -> dict[str, Any]:
        """A signed SNS Notification carrying the SES event as its Message."""
        message = {
            "Type": "Notification",
            "MessageId": str(uuid.uuid4()),
            "TopicArn": topic,
            "Message": json.dumps(event),
            "Timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "SignatureVersion": version,
            "SigningCertURL": self.cert_url,
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
        }
        message.update(overrides)
        return self.sign(message)

    def sign(self, message: dict[str, Any]) -> dict[str, Any]:
        text = "".join(
            f"{name}\n{message[name]}\n"
            for name in _FIELDS[message["Type"]]
            if message.get(name) is not None
        )
        algorithm = hashes.SHA1() if message["SignatureVersion"] == "1" else hashes.SHA256()
        signature = self.key.sign(text.encode(), padding.PKCS1v15(), algorithm)
        return {**message, "Signature": base64.b64encode(signature).decode()}


def ses_bounce(address: str, bounce_type: str = "Permanent") -> dict[str, Any]:
    """SES's bounce event as SES publishes it (notificationType form)."""
    return {
        "notificationType": "Bounce",
        "bounce": {
            "bounceType": bounce_type,
            "bounceSubType": "General",
            "bouncedRecipients": [
                {
                    "emailAddress": address,
                    "action": "failed",
                    "status": "5.1.1" if bounce_type == "Permanent" else "4.4.7",
                    "diagnosticCode": "smtp; 550 5.1.1 user unknown",
                }
            ],
            "timestamp": "2026-12-03T17:12:02.000Z",
            "feedbackId": "0100018c2e1f5a7b-feedback-000000",
            "reportingMTA": "dsn; a27-30.smtp-out.us-west-2.amazonses.com",
        },
        "mail": {
            "timestamp": "2026-12-03T17:11:58.000Z",
            "source": "assistant@example.org",
            "messageId": "0100018c2e1f4b2a-1d2c3b4a-0f9e-4d8c-b7a6-5e4d3c2b1a09-000000",
            "destination": [address],
        },
    }


def ses_complaint(address: str) -> dict[str, Any]:
    return {
        "notificationType": "Complaint",
        "complaint": {
            "complainedRecipients": [{"emailAddress": address}],
            "timestamp": "2026-12-03T18:02:11.000Z",
            "feedbackId": "0100018c2e4c-complaint-000000",
            "userAgent": "ExampleFBL/2.1",
            "complaintFeedbackType": "abuse",
        },
        "mail": {"messageId": "0100018c2e1f4b2a-000000", "destination": [address]},
    }
