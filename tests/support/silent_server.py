"""A TCP server that accepts connections and never answers them.

What a hung S3 endpoint (or a load balancer with no healthy target) looks like to a client:
the connection is made and the request sent, and no byte ever comes back. With
`hang_up=True` it closes each connection at once instead (a reset before any answer). It
counts the connections, so a test can tell how many tries the client made.
"""

from __future__ import annotations

import socket
import threading


class SilentServer:
    def __init__(self, *, hang_up: bool = False) -> None:
        self.hang_up = hang_up
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._held: list[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        self._listener.close()
        for conn in self._held:
            conn.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by __exit__
                return
            self.connections += 1
            if self.hang_up:
                conn.close()
            else:
                self._held.append(conn)  # kept open, never answered
