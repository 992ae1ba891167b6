"""One HTTP(S) GET with a total deadline and a size cap, for the SNS endpoint's outbound calls
(the signing certificate, the SubscribeURL).

urllib's `timeout` bounds each socket operation, not the whole answer: a host that sends a
byte every few seconds held a web worker as long as it liked. Here every read gets only the
time left before the deadline, and the body stops at `max_bytes`. http.client (stdlib) rather
than a client library: two call sites, GET only, and the deadline needs the socket.
"""

from __future__ import annotations

import http.client
import ssl
import time
from urllib.parse import urlsplit

_CHUNK = 8192  # bytes per read


class FetchFailed(Exception):
    """The answer did not come in full, in time, with status 200; the text says why."""


def fetch(url: str, *, deadline_seconds: float, max_bytes: int) -> bytes:
    """The body of `url` (status 200 only), within `deadline_seconds` in all."""
    deadline = time.monotonic() + deadline_seconds

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchFailed(f"no complete answer within {deadline_seconds:g} s")
        return remaining

    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError as exc:
        raise FetchFailed(f"not a URL: {exc}") from exc
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=left(), context=ssl.create_default_context()
        )
    elif parts.scheme == "http":  # only the tests' local servers (allow-listed by the caller)
        connection = http.client.HTTPConnection(host, port, timeout=left())
    else:
        raise FetchFailed(f"not an http(s) URL: {parts.scheme!r}")
    response: http.client.HTTPResponse | None = None
    try:
        path = parts.path or "/"
        connection.request("GET", f"{path}?{parts.query}" if parts.query else path)
        sock = connection.sock  # the response keeps reading it after a Connection: close
        sock.settimeout(left())
        response = connection.getresponse()
        if response.status != 200:
            raise FetchFailed(f"HTTP {response.status} {response.reason}")
        body = bytearray()
        while True:
            sock.settimeout(left())
            chunk = response.read1(_CHUNK)
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > max_bytes:
                raise FetchFailed(f"answer larger than {max_bytes} bytes")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc
    finally:
        # After `Connection: close` the response owns the socket (connection.close() then
        # drops only the connection's reference): a refused answer's socket stayed open until
        # the garbage collector found it, and the host kept sending into it.
        if response is not None:
            response.close()
        connection.close()
