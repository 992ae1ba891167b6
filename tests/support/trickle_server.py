"""An HTTP server whose answer body trickles in: a few bytes, a pause, a few bytes, …

What a slow or overloaded S3 endpoint (or a proxy in front of it) can look like to a client:
the status line and headers arrive at once and promise `Content-Length` bytes, then the body
comes so slowly that every single read finishes within the client's read timeout, yet the
whole body would take hours. `fast = True` makes the next answers send the body at once (the
endpoint recovered). It counts requests and the body bytes it sent.
"""

from __future__ import annotations

import socket
import threading
import time


class TrickleServer:
    def __init__(self, body: bytes, *, chunk: int = 1, interval: float = 0.05) -> None:
        self.body = body
        self.chunk = chunk
        self.interval = interval
        self.fast = False
        self.requests = 0
        self.bytes_sent = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, name="trickle-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TrickleServer:
        self._accepter.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        self._listener.close()
        self._accepter.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by __exit__
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                self.requests += 1
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\n"
                    b"Content-Type: application/octet-stream\r\n"
                    b'ETag: "trickle"\r\n'
                    + f"Content-Length: {len(self.body)}\r\n".encode()
                    + b"Connection: close\r\n\r\n"
                )
                if self.fast:
                    conn.sendall(self.body)
                    self.bytes_sent += len(self.body)
                    return
                for start in range(0, len(self.body), self.chunk):
                    if self._stopped.is_set():
                        return
                    conn.sendall(self.body[start : start + self.chunk])
                    self.bytes_sent += len(self.body[start : start + self.chunk])
                    time.sleep(self.interval)
            except OSError:  # the client gave up and closed: what the test wants
                return
