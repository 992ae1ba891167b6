"""A local TCP proxy whose existing connections can silently stop forwarding.

What a NAT or load-balancer idle timeout, or a failover, looks like to a long-lived client
connection: the socket stays open and no byte comes back, no reset, no FIN. Connections
made after `go_silent()` are forwarded again (a new flow through the same path).
`OutageProxy` is the other failure: the server gone (connections reset, the port closed).
"""

from __future__ import annotations

import contextlib
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


class OutageProxy:
    """A TCP proxy to PostgreSQL that can go down like the server: `down()` resets every
    connection and refuses new ones (the port is closed), `up()` listens on the same port
    again. What a stopped server looks like to its clients, without stopping a server that
    other tests share."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener: socket.socket | None = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> OutageProxy:
        self._start_accepting()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self.down()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
        if listener is not None:
            listener.close()
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.close()  # a reset, as a server that went away
        if self._thread is not None:
            self._thread.join(timeout=5)

    def up(self) -> None:
        with self._lock:
            self._listener = socket.create_server(("127.0.0.1", self.port))
        self._start_accepting()

    def _start_accepting(self) -> None:
        self._thread = threading.Thread(target=self._accept, name="outage-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        selector = selectors.DefaultSelector()
        for sock in peer:
            selector.register(sock, selectors.EVENT_READ)
        try:
            while not self._stopped.is_set():
                for key, _ in selector.select(timeout=0.2):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    peer[key.fileobj].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            for sock in peer:
                sock.close()
