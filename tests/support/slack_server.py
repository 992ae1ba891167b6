"""A local HTTP server that speaks enough of the Slack Web API for slack-sdk's WebClient.

    with SlackServer() as slack:                     # 127.0.0.1, a free port, own thread
        slack.script(SlackServer.error("channel_not_found"),
                     SlackServer.rate_limited(retry_after=1),
                     SlackServer.ok())               # answers in order, then `default`
        client = WebClient(token="xoxb-test", base_url=slack.base_url)
        ...
        slack.posts        # every chat.postMessage received (parsed args), in order
        slack.calls        # every call of any method: Call(method, args, status)

Point the app at it with settings.SLACK_API_URL = slack.base_url. Responses are scripted per
call (FIFO, shared by all methods); with an empty script every call gets `default` (ok), or,
after `slack.misbehave(rate_limited=0.2, server_error=0.2, slow=0.2)`, a random mix of 429s,
HTTP 500s and slow answers (the chaos soak; `slack.behave()` ends it).
Recorded calls include the ones answered with errors, so tests can count attempts.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: dict[str, Any] = field(default_factory=lambda: {"ok": True})
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (a slow Slack)


@dataclass(frozen=True)
class Call:
    method: str
    args: dict[str, Any]
    status: int
    ok: bool  # answered with HTTP 200 and ok=true
    authorization: str
    at: float
    delay: float = 0.0  # seconds the answer was held back (a slow Slack)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up on a slow answer (its timeout) closed the socket: expected."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class SlackServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.default = self.ok()
        self.calls: list[Call] = []
        self._script: deque[Response] = deque()
        self._lock = threading.Lock()
        self._ts_counter = 0
        self._faults: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._slow_seconds: tuple[float, float] = (0.5, 2.5)
        self._rng = random.Random()
        self.slow_answers = 0
        self._server = _QuietServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- responses ---------------------------------------------------------------------------

    @staticmethod
    def ok(**extra: Any) -> Response:
        return Response(200, {"ok": True, **extra})

    @staticmethod
    def error(error: str = "internal_error", status: int = 200) -> Response:
        """Slack reports most API errors as HTTP 200 with ok=false."""
        return Response(status, {"ok": False, "error": error})

    @staticmethod
    def rate_limited(retry_after: int = 1) -> Response:
        return Response(
            429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after)}
        )

    def script(self, *responses: Response) -> None:
        with self._lock:
            self._script.extend(responses)

    def misbehave(
        self,
        *,
        rate_limited: float = 0.0,
        server_error: float = 0.0,
        slow: float = 0.0,
        slow_seconds: tuple[float, float] = (0.5, 2.5),
        seed: int | None = None,
    ) -> None:
        """Answer unscripted calls at random: 429 (Retry-After 1) with probability
        `rate_limited`, HTTP 500 with `server_error`, ok after a delay drawn from
        `slow_seconds` with `slow` (a client with a shorter timeout gives up although the
        post went through), ok otherwise."""
        with self._lock:
            self._faults = (rate_limited, server_error, slow)
            self._slow_seconds = slow_seconds
            self._rng = random.Random(seed)

    def behave(self) -> None:
        """Back to answering every unscripted call ok, at once."""
        self.misbehave()

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def start(self) -> SlackServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> SlackServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- what was received -------------------------------------------------------------------

    @property
    def posts(self) -> list[dict[str, Any]]:
        """Arguments of every chat.postMessage that was answered ok."""
        with self._lock:
            return [c.args for c in self.calls if c.method == "chat.postMessage" and c.ok]

    def attempts(self, method: str = "chat.postMessage") -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    # --- the handler -------------------------------------------------------------------------

    def _next_response(self, method: str, args: dict[str, Any]) -> Response:
        with self._lock:
            response = self._script.popleft() if self._script else self._unscripted()
            if response.status == 200 and response.body.get("ok") and method == "chat.postMessage":
                self._ts_counter += 1
                body = {
                    **response.body,
                    "channel": args.get("channel", ""),
                    "ts": f"{1_700_000_000 + self._ts_counter}.{self._ts_counter:06d}",
                    "message": {"text": args.get("text", ""), "type": "message"},
                }
                response = Response(response.status, body, response.headers, response.delay)
            return response

    def _unscripted(self) -> Response:
        rate_limited, server_error, slow = self._faults
        roll = self._rng.random()
        if roll < rate_limited:
            return self.rate_limited(retry_after=1)
        if roll < rate_limited + server_error:
            return Response(500, {"ok": False, "error": "internal_error"})
        if roll < rate_limited + server_error + slow:
            self.slow_answers += 1
            base = self.default
            return Response(
                base.status, base.body, base.headers, self._rng.uniform(*self._slow_seconds)
            )
        return self.default

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep test output clean

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                content_type = self.headers.get("Content-Type", "")
                if "json" in content_type:
                    try:
                        args = json.loads(raw or b"{}")
                    except ValueError:
                        args = {}
                else:
                    args = dict(parse_qsl(raw.decode("utf-8", "replace")))
                method = self.path.rsplit("/", 1)[-1].split("?", 1)[0]
                response = server._next_response(method, args)
                if response.delay:
                    time.sleep(response.delay)
                answered_ok = response.status == 200 and bool(response.body.get("ok"))
                with server._lock:
                    server.calls.append(
                        Call(
                            method=method,
                            args=args,
                            status=response.status,
                            ok=answered_ok,
                            authorization=self.headers.get("Authorization", ""),
                            at=time.time(),
                            delay=response.delay,
                        )
                    )
                payload = json.dumps(response.body).encode()
                self.send_response(response.status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in response.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST

        return Handler
