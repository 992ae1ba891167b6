"""A PostgreSQL wire-protocol proxy that counts round trips and faults one of them (issue 30).

Every connection the code under test opens (Django's, the job keeper's, the writer-slot
lease's, the process beacon's) goes through it, so a round trip is counted whoever makes it.
A round trip is what the client sends up to a Sync or a simple Query (or the start-up
handshake, named `<connect>`) and the server's answer up to its ReadyForQuery, whose status
byte says whether the session is idle (`I`: committed or autocommit), in a transaction
(`T`) or in a failed one (`E`).

A round trip is named by its statement with literals replaced by `?` and its occurrence among
the round trips of that statement in the run: the keeper thread or a lease renewal may
interleave differently from run to run, the n-th claim statement is still the n-th.

Faults, at one named round trip:
- `error_before`: the request is never forwarded; both sockets close, the client sees an
  OperationalError and the server rolls back whatever the session had open;
- `lost_answer`: the request runs and the server answers (a commit is durable), then both
  sockets close before the answer is forwarded: the client sees an OperationalError;
- `kill_after`: the request runs and the server answers, then `on_kill` (the harness
  SIGKILLs the process under test) before the answer is forwarded: the process died right
  after the statement succeeded;
- `crash_after` (issue 37, point 5; the runner's scenarios, on a throwaway cluster): the
  request runs and the server answers, then `on_crash` (the harness stops PostgreSQL with
  `pg_ctl stop -m immediate`, losing what was only in its memory, and starts it again),
  then the answer is forwarded and the connection closed: the process saw its statement
  succeed, and the server it succeeded on died right after. A commit made with
  `synchronous_commit` off may be lost with it; a durable one must be there after the
  restart. From the answer's arrival to the restart no other connection's request is
  forwarded: a durable commit of another thread would otherwise flush the WAL of an
  asynchronous one before the crash, and hide its loss.
"""

from __future__ import annotations

import re
import selectors
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

ERROR_BEFORE = "error_before"
LOST_ANSWER = "lost_answer"
KILL_AFTER = "kill_after"
CRASH_AFTER = "crash_after"
# The kinds every scenario is enumerated under; CRASH_AFTER needs a harness on a throwaway
# cluster (FaultHarness(cluster=...)), so a scenario asks for it by name.
FAULT_KINDS = (ERROR_BEFORE, LOST_ANSWER, KILL_AFTER)
ALL_FAULT_KINDS = (*FAULT_KINDS, CRASH_AFTER)
CONNECT = "<connect>"

_UNTYPED_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered by one byte
_ENDS_REQUEST = {b"S", b"Q", b"F"}  # Sync, simple Query, FunctionCall


def fingerprint(sql: str) -> str:
    """The statement with its literals (strings, numbers, NULL and booleans, each with the
    casts that follow it, parameter markers, value lists) replaced, so the same statement
    with other ids, times or missing values has the same name."""
    text = re.sub(r"[EeXxBb]?'(?:[^']|'')*'", "?", sql)
    text = re.sub(r"\$\d+|(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])", "?", text)
    text = re.sub(r"\s+", " ", text).strip()
    # A parameter is whatever literal psycopg renders for its value, typed as it chooses
    # (`'{7}'::int2[]`, `'{70000}'::int4[]`, NULL for None, true/false), then cast by the
    # statement: one name for all, or the name a step carries depends on its values, and a
    # case picked in one run is never reached in the next (tests/faults/test_fingerprint.py).
    text = re.sub(r"(?:\?|\bNULL\b|\btrue\b|\bfalse\b)(?: ?:: ?\w+(?: ?\[\])?)*", "?", text)
    text = re.sub(r"\(\s*\?(?:\s*,\s*\?)*\s*\)", "(?)", text)  # casts went with their literal
    text = re.sub(r"\(\?\)(?:\s*,\s*\(\?\))+", "(?)", text)
    return text


@dataclass(frozen=True)
class RoundTrip:
    seq: int  # order of its request among all connections in this run
    connection: int  # which connection of this run (1 = the first opened)
    statement: str
    occurrence: int  # 1 = the first round trip of this statement in this run
    status: str = ""  # ReadyForQuery's status (I, T, E); "" if never answered

    @property
    def committed(self) -> bool:
        """The server was idle after it: it committed (or ran in autocommit)."""
        return self.status == "I"


@dataclass(frozen=True)
class Fault:
    kind: str
    statement: str
    occurrence: int

    def __post_init__(self) -> None:
        if self.kind not in ALL_FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")


class FaultProxy:
    """Forward PostgreSQL connections from 127.0.0.1:`port` to `target`; `begin()` starts a
    run (with at most one fault), `end()` returns its round trips in order."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._open: set[socket.socket] = set()
        self._forwarding = threading.Event()  # cleared while a crash_after stops the server
        self._forwarding.set()
        self._thread = threading.Thread(target=self._accept, name="pg-fault-proxy", daemon=True)
        self._reset(None, None)

    def _reset(
        self,
        fault: Fault | None,
        on_kill: Callable[[], None] | None,
        on_fire: Callable[[], None] | None = None,
        on_crash: Callable[[], None] | None = None,
    ) -> None:
        self.fault = fault
        self.fired = False
        self._on_kill = on_kill
        self._on_fire = on_fire
        self._on_crash = on_crash
        self._log: list[list] = []  # [seq, connection, statement, occurrence, status]
        self._counts: dict[str, int] = {}
        self._connections = 0

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._listener.close()
        self.drop_all()
        self._thread.join(timeout=5)

    def begin(
        self,
        fault: Fault | None = None,
        on_kill: Callable[[], None] | None = None,
        on_fire: Callable[[], None] | None = None,
        on_crash: Callable[[], None] | None = None,
    ) -> None:
        """Start counting a new run; `fault` fires at its round trip (`on_fire` is called
        when its connection is cut, e.g. so a scenario can act at that exact moment;
        `on_crash` stops and restarts the server, for `crash_after`)."""
        with self._lock:
            self._reset(fault, on_kill, on_fire, on_crash)

    def end(self) -> list[RoundTrip]:
        with self._lock:
            return [RoundTrip(*entry) for entry in self._log]

    def drop_all(self) -> None:
        """Close every connection still open (a killed process's peers, a hung one)."""
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._connections += 1
                number = self._connections
                self._open.update((client, server))
            threading.Thread(
                target=_Pump(self, number, client, server).run, name="pg-fault-pump", daemon=True
            ).start()

    def _request(self, connection: int, statement: str) -> tuple[list, str | None]:
        """Log a round trip's request; return its log entry and the fault to apply, if any."""
        with self._lock:
            occurrence = self._counts.get(statement, 0) + 1
            self._counts[statement] = occurrence
            entry = [len(self._log) + 1, connection, statement, occurrence, ""]
            self._log.append(entry)
            fault = self.fault
            if (
                fault is not None
                and not self.fired
                and (fault.statement, fault.occurrence) == (statement, occurrence)
            ):
                self.fired = True
                return entry, fault.kind
            return entry, None

    def _answered(self, entry: list, status: str) -> None:
        with self._lock:
            entry[4] = status

    def _kill(self) -> None:
        if self._on_kill is not None:
            self._on_kill()

    def _crash(self) -> None:
        if self._on_crash is None:
            raise RuntimeError("a crash_after fault needs a harness on a throwaway cluster")
        self._forwarding.clear()
        try:
            self._on_crash()
        finally:
            self._forwarding.set()

    def _cut(self) -> None:
        if self._on_fire is not None:
            self._on_fire()


class _Pump:
    """One proxied connection: parse both directions into messages, one thread."""

    def __init__(
        self, proxy: FaultProxy, number: int, client: socket.socket, server: socket.socket
    ):
        self.proxy = proxy
        self.number = number
        self.client = client
        self.server = server
        self.from_client = b""
        self.from_server = b""
        self.startup = True
        self.single_bytes = 0  # answers of one raw byte owed (to SSL/GSS requests)
        self.request: list[bytes] = []  # messages of the request being read
        self.statement = ""
        self.answer: list[bytes] = []  # messages of the answer being read
        self.pending: deque[tuple[list, str | None]] = deque()

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.client, selectors.EVENT_READ)
        selector.register(self.server, selectors.EVENT_READ)
        try:
            while not self.proxy._stopped.is_set():
                for key, _ in selector.select(timeout=0.2):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if key.fileobj is self.client:
                        self.from_client += data
                        if not self._client_messages():
                            return
                    else:
                        self.from_server += data
                        if not self._server_messages():
                            return
        except OSError:
            return
        finally:
            selector.close()
            _close(self.client)
            _close(self.server)

    def _client_messages(self) -> bool:
        while True:
            if self.startup:
                if len(self.from_client) < 8:
                    return True
                (length,) = struct.unpack("!I", self.from_client[:4])
                if len(self.from_client) < length:
                    return True
                message, self.from_client = self.from_client[:length], self.from_client[length:]
                (code,) = struct.unpack("!I", message[4:8])
                if code in _UNTYPED_REQUESTS:
                    self.single_bytes += 1
                    self.server.sendall(message)
                    continue
                self.startup = False
                if not self._send_request([message], CONNECT):
                    return False
                continue
            if len(self.from_client) < 5:
                return True
            (length,) = struct.unpack("!I", self.from_client[1:5])
            if len(self.from_client) < length + 1:
                return True
            message = self.from_client[: length + 1]
            self.from_client = self.from_client[length + 1 :]
            kind = message[:1]
            if kind == b"X":  # Terminate: not a round trip
                self.server.sendall(message)
                continue
            self.request.append(message)
            if kind in (b"P", b"Q") and not self.statement:
                body = message[5:]
                if kind == b"P":
                    body = body[body.index(b"\0") + 1 :]
                self.statement = fingerprint(body[: body.index(b"\0")].decode("utf-8", "replace"))
            if kind in _ENDS_REQUEST:
                request, self.request = self.request, []
                statement, self.statement = self.statement or "<extended>", ""
                if not self._send_request(request, statement):
                    return False

    def _send_request(self, messages: list[bytes], statement: str) -> bool:
        entry, fault = self.proxy._request(self.number, statement)
        if fault == ERROR_BEFORE:
            self.proxy._cut()
            return False  # never forwarded: closing both rolls back what the session had
        if statement != CONNECT:  # a backend left waiting for its start-up packet
            self.proxy._forwarding.wait()  # held while a crash_after stops the server
        self.server.sendall(b"".join(messages))
        self.pending.append((entry, fault))
        return True

    def _server_messages(self) -> bool:
        while True:
            if self.single_bytes:
                if not self.from_server:
                    return True
                self.client.sendall(self.from_server[:1])
                self.from_server = self.from_server[1:]
                self.single_bytes -= 1
                continue
            if len(self.from_server) < 5:
                return True
            (length,) = struct.unpack("!I", self.from_server[1:5])
            if len(self.from_server) < length + 1:
                return True
            message = self.from_server[: length + 1]
            self.from_server = self.from_server[length + 1 :]
            if not self.pending:  # a NOTIFY or notice between round trips
                self.client.sendall(message)
                continue
            self.answer.append(message)
            if message[:1] != b"Z":
                continue
            entry, fault = self.pending.popleft()
            self.proxy._answered(entry, message[5:6].decode())
            answer, self.answer = self.answer, []
            if fault == KILL_AFTER:
                self.proxy._kill()
                self.proxy._cut()
                return False
            if fault == LOST_ANSWER:
                self.proxy._cut()
                return False
            if fault == CRASH_AFTER:
                # The server dies with the answer on its way: the client gets it, then its
                # connection ends (the server is already gone).
                self.proxy._crash()
                self.client.sendall(b"".join(answer))
                self.proxy._cut()
                return False
            self.client.sendall(b"".join(answer))


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
