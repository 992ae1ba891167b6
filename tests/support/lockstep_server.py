"""An HTTP server that sends its body no faster than the client reads it, so the bytes it sent
tell how much the client read (Linux: it watches both ends' queues in /proc/net/tcp).

A server that writes a large body at once tells nothing about the client: the kernel's
socket buffers (hundreds of KiB on loopback) take the bytes whether the client reads them or
not. Here each `chunk` is written only once everything before it has left the server's send
queue and the client's receive queue (read by the client process), so when the client stops
reading and hangs up, `bytes_sent` is at most what it read plus one chunk.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

_TCP_TABLE = Path("/proc/net/tcp")
_ESTABLISHED = "01"


def available() -> bool:
    return _TCP_TABLE.exists()


def _address(host: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it (the host's byte order, then the port)."""
    packed = socket.inet_aton(host)
    return f"{int.from_bytes(packed, sys.byteorder):08X}:{port:04X}"


def _queues(*ends: tuple[tuple[str, int], tuple[str, int]]) -> list[tuple[int, int] | None]:
    """(send queue, receive queue) of each established TCP socket (local, remote) in `ends`,
    from one read of the table; None for one that is closed or closing (a hang-up)."""
    wanted = {(_address(*local), _address(*remote)): n for n, (local, remote) in enumerate(ends)}
    found: list[tuple[int, int] | None] = [None] * len(ends)
    for line in _TCP_TABLE.read_text().splitlines()[1:]:
        fields = line.split()
        n = wanted.get((fields[1], fields[2]))
        if n is not None and fields[3] == _ESTABLISHED:
            tx, rx = fields[4].split(":")
            found[n] = (int(tx, 16), int(rx, 16))
    return found


class LockstepServer:
    def __init__(self, body: bytes, *, chunk: int = 4096, timeout: float = 30) -> None:
        self.body = body
        self.chunk = chunk
        self.timeout = timeout
        self.bytes_sent = 0
        self._ends: tuple[tuple[str, int], tuple[str, int]] | None = None  # (ours, the client's)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="lockstep-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LockstepServer:
        self._thread.start()
        return self

    def client_connected(self) -> bool:
        """Whether the client's end of the connection is still open (established): a client that
        closed its socket is in FIN_WAIT at once, so this is False right after its close()."""
        if self._ends is None:
            return False
        local, peer = self._ends
        return _queues((peer, local))[0] is not None

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(timeout=self.timeout)

    def _serve(self) -> None:
        try:
            conn, peer = self._listener.accept()
        except OSError:  # closed by __exit__ before any request
            return
        with conn:
            conn.recv(65536)  # the request: one GET, small enough for one read on loopback
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-pem-file\r\n"
                + f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n".encode()
            )
            local = conn.getsockname()
            self._ends = (local, peer)
            deadline = time.monotonic() + self.timeout
            for start in range(0, len(self.body), self.chunk):
                if not self._read_up(local, peer, deadline):
                    return
                try:
                    conn.sendall(self.body[start : start + self.chunk])
                except OSError:  # the client hung up
                    return
                self.bytes_sent += len(self.body[start : start + self.chunk])

    @staticmethod
    def _read_up(local: tuple[str, int], peer: tuple[str, int], deadline: float) -> bool:
        """Wait until the client has read all that was sent; False once it hung up."""
        while time.monotonic() < deadline:
            ours, theirs = _queues((local, peer), (peer, local))
            if ours is None or theirs is None:
                return False
            if ours[0] == 0 and theirs[1] == 0:
                return True
            time.sleep(0.001)
        return False
