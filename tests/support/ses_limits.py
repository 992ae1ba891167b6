"""A local SES endpoint that enforces what real SES enforces on a sender: a sending rate (a
token bucket of MaxSendRate tokens a second) and a daily quota (Max24HourSend).

moto accepts every send at any speed, so it cannot show pacing. This speaks SES's query API
(form-encoded POST, XML answers) for the two calls the sender makes, `SendRawEmail` and
`GetSendQuota`, over HTTP on 127.0.0.1; point boto3 at it with AWS_ENDPOINT_URL. Its answers
over a limit are SES's own: HTTP 400, code `Throttling`, message "Maximum sending rate
exceeded." or "Daily message quota exceeded.". The tests and bench/ses_pacing.py read its
counters.

    with SesLimits(rate=14, daily_quota=300) as ses:
        monkeypatch.setenv("AWS_ENDPOINT_URL", ses.url)
        ...
        ses.accepted, ses.throttled_rate, ses.throttled_quota
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

_NS = "http://ses.amazonaws.com/doc/2010-12-01/"


class SesLimits:
    """SES with a token bucket of `rate` tokens a second (holding at most `burst`, by default
    one second's worth) and `daily_quota` sends (None: no quota)."""

    def __init__(
        self, *, rate: float, daily_quota: int | None = None, burst: float | None = None
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.daily_quota = daily_quota
        self._tokens = self.burst
        self._refilled = time.monotonic()
        self._lock = threading.Lock()
        self.accepted: list[dict[str, Any]] = []  # {"to", "message_id", "raw", "at"}
        self.throttled_rate = 0
        self.throttled_quota = 0
        self.quota_calls = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def calls(self) -> int:
        return len(self.accepted) + self.throttled_rate + self.throttled_quota

    def recipients(self) -> list[str]:
        return [sent["to"] for sent in self.accepted]

    def free_quota(self) -> None:
        """The 24-hour window moved on: the sends counted against the quota so far fall out."""
        with self._lock:
            for sent in self.accepted:
                sent["counted"] = False

    def sent_last_24_hours(self) -> int:
        return sum(1 for sent in self.accepted if sent.get("counted", True))

    def __enter__(self) -> SesLimits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- the two calls ---------------------------------------------------------------------

    def _send(self, form: dict[str, list[str]]) -> tuple[int, str]:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self.daily_quota is not None and self.sent_last_24_hours() >= self.daily_quota:
                self.throttled_quota += 1
                return _error("Throttling", "Daily message quota exceeded.")
            if self._tokens < 1:
                self.throttled_rate += 1
                return _error("Throttling", "Maximum sending rate exceeded.")
            self._tokens -= 1
            raw = _b64(form.get("RawMessage.Data", [""])[0])
            to = form.get("Destinations.member.1", [""])[0]
            if not to:
                to = str(message_from_bytes(raw).get("To", ""))
            message_id = f"{uuid.uuid4()}-000000"
            self.accepted.append({"to": to, "message_id": message_id, "raw": raw, "at": now})
        return 200, (
            f'<SendRawEmailResponse xmlns="{_NS}"><SendRawEmailResult>'
            f"<MessageId>{message_id}</MessageId></SendRawEmailResult>"
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
            "</SendRawEmailResponse>"
        )

    def _quota(self) -> tuple[int, str]:
        with self._lock:
            self.quota_calls += 1
            sent = self.sent_last_24_hours()
        maximum = -1.0 if self.daily_quota is None else float(self.daily_quota)
        return 200, (
            f'<GetSendQuotaResponse xmlns="{_NS}"><GetSendQuotaResult>'
            f"<SentLast24Hours>{float(sent)}</SentLast24Hours>"
            f"<Max24HourSend>{maximum}</Max24HourSend>"
            f"<MaxSendRate>{float(self.rate)}</MaxSendRate>"
            f"</GetSendQuotaResult><ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId>"
            "</ResponseMetadata></GetSendQuotaResponse>"
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        ses = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
                action = form.get("Action", [""])[0]
                if action == "SendRawEmail":
                    status, body = ses._send(form)
                elif action == "GetSendQuota":
                    status, body = ses._quota()
                else:
                    status, body = _error("InvalidAction", f"{action} is not served here")
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler


def _b64(value: str) -> bytes:
    return base64.b64decode(value) if value else b""


def _error(code: str, message: str) -> tuple[int, str]:
    return 400, (
        f'<ErrorResponse xmlns="{_NS}"><Error><Type>Sender</Type><Code>{code}</Code>'
        f"<Message>{escape(message)}</Message></Error>"
        f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>"
    )
