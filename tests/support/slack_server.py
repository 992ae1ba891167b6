"""A local HTTP server that speaks enough of the Slack Web API for slack-sdk's WebClient.

    with SlackServer() as slack:                     # 127.0.0.1, a free port, own thread
        slack.script(SlackServer.error("channel_not_found"),
                     SlackServer.rate_limited(retry_after=1),
                     SlackServer.ok())               # answers in order, then `default`
        client = WebClient(token="xoxb-test", base_url=slack.base_url)
        ...
        slack.posts        # every chat.postMessage answered ok (parsed args), in order
        slack.calls        # every call of any method: Call(method, args, status)
        slack.channel_messages("C1")   # what the channel shows: every message it kept
        slack.channels()               # the channels that kept a message

Point the app at it with settings.SLACK_API_URL = slack.base_url. Responses are scripted per
call (FIFO, shared by all methods, or per method with `script(..., method=...)`); with an
empty script a call gets `defaults[method]` if set, else `default` (ok). Recorded calls
include the ones answered with errors, so tests can count attempts.

Like Slack, a message is kept in its channel (with its `metadata`) when chat.postMessage is
accepted, and `conversations.history` answers from what was kept: newest first, `oldest` /
`latest` (exclusive unless `inclusive`), `limit`, cursor pagination (`has_more`,
`response_metadata.next_cursor`), and a message's `metadata` only with
`include_all_metadata`. Ambiguous failures keep the message and then misbehave:
`slow(seconds)` answers after the client gave up, `error_after_post()` answers 500, and
`reset_after_post()` resets the connection instead of answering, `truncated_after_post()`
cuts the answer's body short.
`late(seconds)` is a Slack that takes that long to handle a call: a post shows in the
channel only then, with the answer, even if the client gave up (`trickle=True`: the
answer's head arrives a line at a time meanwhile, so a per-read timeout never fires).

Files as slack-sdk's `files_upload_v2` sends them: files.getUploadURLExternal answers a file
id and an upload URL on this server, the upload keeps the bytes (`slack.uploaded(file_id)`,
method "upload" in `slack.calls`), and files.completeUploadExternal (only for files uploaded
in full) keeps one message with the files in the channel or its thread
(`slack.shared_files(channel)`); scripted failures apply to it as to a post.
conversations.replies answers a thread; conversations.history leaves thread replies out.

After
`slack.misbehave(rate_limited=0.2, server_error=0.2, slow=0.2)` unscripted calls get a random
mix of 429s, HTTP 500s and slow answers (the chaos soak; `slack.behave()` ends it).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import socket
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: dict[str, Any] = field(default_factory=lambda: {"ok": True})
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (the request was already handled)
    keeps_post: bool | None = None  # chat.postMessage kept in the channel (None: when ok)
    reset: bool = False  # reset the connection (RST) instead of answering
    truncated: bool = False  # send half the promised body, then close (a proxy cut it short)
    # Slack takes `delay` to handle the call: a post appears in the channel only then, when
    # the answer is sent (whether or not the client still waits for it).
    kept_late: bool = False
    # The status line and then one header line at a time trickle in over `delay`: every read
    # of the client gets bytes well within its timeout, so only a total deadline ends it.
    trickle: bool = False


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
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class SlackServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.default = self.ok()
        self.defaults: dict[str, Response] = {}  # per method, before `default`
        self.calls: list[Call] = []
        self._script: deque[Response] = deque()
        self._method_scripts: dict[str, deque[Response]] = {}
        self._messages: dict[str, list[dict[str, Any]]] = {}  # channel -> kept, oldest first
        self._files: dict[str, dict[str, Any]] = {}  # file id -> name, length, uploaded bytes
        self._lock = threading.Lock()
        self._last_ts = 0.0
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

    @staticmethod
    def slow(seconds: float, then: Response | None = None) -> Response:
        """Handle the call at once (a post is kept) but answer only after `seconds`."""
        then = then or SlackServer.ok()
        return Response(then.status, then.body, then.headers, delay=seconds, keeps_post=True)

    @staticmethod
    def late(seconds: float, *, trickle: bool = False) -> Response:
        """Slack takes `seconds` to handle the call: a post is kept (shown in the history)
        only after them, when the answer is sent, even if the client gave up meanwhile. With
        `trickle` the answer's head arrives a line at a time over those seconds, so a client
        whose timeout is per read (not total) keeps waiting."""
        return Response(200, {"ok": True}, delay=seconds, kept_late=True, trickle=trickle)

    @staticmethod
    def error_after_post(status: int = 500) -> Response:
        """The message is kept, then the answer is an HTTP error (a 5xx from Slack's edge)."""
        return Response(status, {"ok": False, "error": "internal_error"}, keeps_post=True)

    @staticmethod
    def reset_after_post() -> Response:
        """The message is kept, then the connection is reset with no answer."""
        return Response(200, {"ok": True}, keeps_post=True, reset=True)

    @staticmethod
    def truncated_after_post() -> Response:
        """The message is kept, then the answer stops halfway through its body (the
        Content-Length promises more) and the connection closes: http.client.IncompleteRead."""
        return Response(200, {"ok": True}, keeps_post=True, truncated=True)

    def script(self, *responses: Response, method: str | None = None) -> None:
        """Queue answers for the next calls (of `method` only, when given)."""
        with self._lock:
            if method is None:
                self._script.extend(responses)
            else:
                self._method_scripts.setdefault(method, deque()).extend(responses)

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

    def _unscripted(self, method: str) -> Response:
        if method in self.defaults:
            return self.defaults[method]
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

    def channels(self) -> list[str]:
        """Every channel that kept a message."""
        with self._lock:
            return sorted(self._messages)

    def channel_messages(self, channel: str) -> list[dict[str, Any]]:
        """Every message the channel kept (oldest first), whatever the poster was answered."""
        with self._lock:
            return [dict(m) for m in self._messages.get(channel, [])]

    # --- the handler -------------------------------------------------------------------------

    def _next_response(self, method: str, args: dict[str, Any]) -> Response:
        with self._lock:
            queue = self._method_scripts.get(method)
            if queue:
                response = queue.popleft()
            elif self._script:
                response = self._script.popleft()
            else:
                response = self._unscripted(method)
            answered_ok = response.status == 200 and bool(response.body.get("ok"))
            if method in _POSTING_METHODS and not response.kept_late:
                response = self._post(method, args, response)
            elif method == "files.getUploadURLExternal" and answered_ok:
                file_id = f"F{len(self._files) + 1:08d}"
                self._files[file_id] = {
                    "id": file_id,
                    "name": str(args.get("filename", "")),
                    "length": int(args.get("length") or 0),
                    "data": None,
                }
                response = dataclasses.replace(
                    response,
                    body={
                        **response.body,
                        "file_id": file_id,
                        "upload_url": f"http://127.0.0.1:{self.port}/upload/{file_id}",
                    },
                )
            elif method == "upload" and answered_ok:
                upload = self._files.get(str(args.get("file_id")))
                if upload is None:
                    response = Response(404, {"ok": False, "error": "file_not_found"})
                else:
                    upload["data"] = args["data"]
            elif method == "conversations.history" and answered_ok:
                response = dataclasses.replace(
                    response, body={**response.body, **self._history(args)}
                )
            elif method == "conversations.replies" and answered_ok:
                response = dataclasses.replace(
                    response, body={**response.body, **self._history(args, thread=True)}
                )
            return response

    def _post(self, method: str, args: dict[str, Any], response: Response) -> Response:
        """Keep a chat.postMessage, or the message of a files.completeUploadExternal, in its
        channel (when the response says so) and answer as Slack does. With the lock held."""
        answered_ok = response.status == 200 and bool(response.body.get("ok"))
        keeps = answered_ok if response.keeps_post is None else response.keeps_post
        if method == "files.completeUploadExternal":
            files = self._completed_files(args)
            if files is None:
                return Response(200, {"ok": False, "error": "file_upload_not_completed"})
            if keeps:
                self._keep(
                    {
                        "channel": args.get("channel_id", ""),
                        "text": args.get("initial_comment", ""),
                        "thread_ts": args.get("thread_ts", ""),
                        "files": files,
                    }
                )
            if not answered_ok:
                return response
            return dataclasses.replace(response, body={**response.body, "files": files})
        if not keeps:
            return response
        message = self._keep(args)
        if not answered_ok:
            return response
        body = {
            **response.body,
            "channel": args.get("channel", ""),
            "ts": message["ts"],
            "message": {k: v for k, v in message.items() if k != "metadata"},
        }
        return dataclasses.replace(response, body=body)

    def _handled_late(self, method: str, args: dict[str, Any], response: Response) -> Response:
        """The end of a call Slack took long to handle (`late`): a post is kept only now."""
        with self._lock:
            if method in _POSTING_METHODS:
                return self._post(method, args, dataclasses.replace(response, kept_late=False))
            return response

    def _completed_files(self, args: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The files a files.completeUploadExternal names, each uploaded in full; None when
        one was never asked for or not (fully) uploaded, as Slack refuses it then."""
        try:
            wanted = json.loads(args.get("files") or "[]")
        except ValueError:
            return None
        files = []
        for item in wanted if isinstance(wanted, list) else []:
            upload = self._files.get(str(item.get("id")))
            if upload is None or upload["data"] is None or len(upload["data"]) != upload["length"]:
                return None
            files.append(
                {
                    "id": upload["id"],
                    "name": upload["name"],
                    "title": item.get("title") or upload["name"],
                    "size": upload["length"],
                }
            )
        return files or None

    def uploaded(self, file_id: str) -> bytes | None:
        """The bytes uploaded for a file id (None: never uploaded)."""
        with self._lock:
            upload = self._files.get(file_id)
            return None if upload is None else upload["data"]

    def shared_files(self, channel: str) -> list[dict[str, Any]]:
        """Every file shown in the channel (threads included), oldest first, with the ts of
        the message that shares it and the thread it is in."""
        with self._lock:
            return [
                {**f, "message_ts": m["ts"], "thread_ts": m.get("thread_ts", "")}
                for m in self._messages.get(channel, [])
                for f in m.get("files", [])
            ]

    def _keep(self, args: dict[str, Any]) -> dict[str, Any]:
        """Store a posted message as Slack does; ts from the clock, strictly increasing."""
        ts = max(round(time.time(), 6), round(self._last_ts + 0.000001, 6))
        self._last_ts = ts
        message: dict[str, Any] = {
            "type": "message",
            "subtype": "bot_message",
            "text": args.get("text", ""),
            "ts": f"{ts:.6f}",
            "bot_id": "B0TEST",
        }
        if args.get("thread_ts"):
            message["thread_ts"] = str(args["thread_ts"])
        if args.get("files"):
            message["files"] = args["files"]
        metadata = args.get("metadata")
        if isinstance(metadata, str):  # form-encoded clients send it as JSON text
            try:
                metadata = json.loads(metadata)
            except ValueError:
                metadata = None
        if isinstance(metadata, dict) and metadata.get("event_type"):
            message["metadata"] = {
                "event_type": metadata["event_type"],
                "event_payload": metadata.get("event_payload") or {},
            }
        self._messages.setdefault(str(args.get("channel", "")), []).append(message)
        return message

    def _history(self, args: dict[str, Any], *, thread: bool = False) -> dict[str, Any]:
        """conversations.history over the kept messages, newest first, paginated; thread
        replies are not in it. With `thread`: conversations.replies, the thread of `ts`
        (its parent first, then the replies, oldest first)."""
        if thread:
            parent = str(args.get("ts", ""))
            selected = [
                m
                for m in self._messages.get(str(args.get("channel", "")), [])
                if m["ts"] == parent or m.get("thread_ts") == parent
            ]
            with_metadata = _truthy(args.get("include_all_metadata"))
            return self._page(args, selected, with_metadata=with_metadata)
        inclusive = _truthy(args.get("inclusive"))
        oldest = float(args.get("oldest") or 0)
        latest = float(args.get("latest") or 0) or float("inf")
        with_metadata = _truthy(args.get("include_all_metadata"))
        selected = [
            m
            for m in reversed(self._messages.get(str(args.get("channel", "")), []))
            if (oldest <= float(m["ts"]) if inclusive else oldest < float(m["ts"]))
            and (float(m["ts"]) <= latest if inclusive else float(m["ts"]) < latest)
            and m.get("thread_ts", m["ts"]) == m["ts"]
        ]
        return self._page(args, selected, with_metadata=with_metadata)

    @staticmethod
    def _page(
        args: dict[str, Any], selected: list[dict[str, Any]], *, with_metadata: bool
    ) -> dict[str, Any]:
        limit = max(1, min(int(args.get("limit") or 100), 999))
        cursor = str(args.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode().removeprefix("next:")) if cursor else 0
        page = selected[start : start + limit]
        more = start + limit < len(selected)
        next_cursor = base64.b64encode(f"next:{start + limit}".encode()).decode() if more else ""
        return {
            "messages": [
                {k: v for k, v in m.items() if k != "metadata" or with_metadata} for m in page
            ],
            "has_more": more,
            "pin_count": 0,
            "response_metadata": {"next_cursor": next_cursor},
        }

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
                url = urlsplit(self.path)
                args: dict[str, Any] = dict(parse_qsl(url.query))  # GET methods (history)
                if "json" in content_type:
                    try:
                        body = json.loads(raw or b"{}")
                    except ValueError:
                        body = {}
                    args.update(body if isinstance(body, dict) else {})
                else:
                    args.update(parse_qsl(raw.decode("utf-8", "replace")))
                method = url.path.rsplit("/", 1)[-1]
                if url.path.startswith("/upload/"):  # files.getUploadURLExternal's URL
                    method, args = "upload", {"file_id": method, "data": raw, "size": len(raw)}
                response = server._next_response(method, args)
                answered_ok = response.status == 200 and bool(response.body.get("ok"))
                with server._lock:
                    server.calls.append(
                        Call(
                            method=method,
                            args=args,
                            status=0 if response.reset else response.status,
                            ok=answered_ok and not response.reset,
                            authorization=self.headers.get("Authorization", ""),
                            at=time.time(),
                            delay=response.delay,
                        )
                    )
                if response.reset:
                    # SO_LINGER 0: close() sends a RST, the client sees a reset connection.
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                    self.close_connection = True
                    return
                if response.trickle:
                    self._trickle_head(response.delay)
                elif response.delay:
                    time.sleep(response.delay)
                if response.kept_late:  # kept now, whether or not the client still waits
                    response = server._handled_late(method, args, response)
                try:
                    payload = json.dumps(response.body).encode()
                    if response.trickle:
                        self.wfile.write(
                            b"Content-Type: application/json; charset=utf-8\r\n"
                            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                            + payload
                        )
                        self.wfile.flush()
                        return
                    self.send_response(response.status)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in response.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if response.truncated:
                        self.wfile.write(payload[: len(payload) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(payload)
                except OSError:  # the client gave up waiting (slow answers): nothing to do
                    self.close_connection = True

            def _trickle_head(self, seconds: float) -> None:
                """The status line, then a header line every 0.1 s for `seconds` (to the end
                of them even if the client hangs up: Slack goes on with the call)."""
                end = time.monotonic() + seconds
                line = 0
                try:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    self.wfile.flush()
                    while time.monotonic() < end:
                        time.sleep(min(0.1, max(0.0, end - time.monotonic())))
                        self.wfile.write(f"X-Slack-Still-Working: {line}\r\n".encode())
                        self.wfile.flush()
                        line += 1
                except OSError:
                    time.sleep(max(0.0, end - time.monotonic()))

            do_GET = do_POST

        return Handler


# Methods whose success shows a message in the channel (kept with `_keep`).
_POSTING_METHODS = ("chat.postMessage", "files.completeUploadExternal")


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes"}
