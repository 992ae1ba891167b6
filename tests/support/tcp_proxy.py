"""A local TCP proxy whose existing connections can silently stop forwarding.

What a NAT or load-balancer idle timeout, or a failover, looks like to a long-lived client
connection: the socket stays open and no byte comes back, no reset, no FIN. Connections
made after `go_silent()` are forwarded again (a new flow through the same path).
"""

from __future__ import annotations

import selectors
import socket
import threading


class SilencingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._silent: set[socket.socket] = set()  # client sockets no longer forwarded
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    def __enter__(self) -> SilencingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            for pair in self._pairs:
                for sock in pair:
                    sock.close()
        self._thread.join(timeout=5)

    def go_silent(self) -> None:
        """Stop forwarding on every connection open now, keeping each socket open."""
        with self._lock:
            self._silent.update(client for client, _server in self._pairs)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(self.target)
            with self._lock:
                self._pairs.append((client, server))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        selector = selectors.DefaultSelector()
        for sock in peer:
            selector.register(sock, selectors.EVENT_READ)
        try:
            while not self._stopped.is_set():
                with self._lock:
                    silent = client in self._silent
                if silent:  # hold the sockets open, read nothing, send nothing
                    self._stopped.wait(0.2)
                    continue
                for key, _ in selector.select(timeout=0.2):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    peer[key.fileobj].sendall(data)
        except OSError:
            return
        finally:
            selector.close()
