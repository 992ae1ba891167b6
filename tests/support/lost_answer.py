"""Fault injection: a statement that commits and whose answer never reaches the client.

What a failover, a `pg_terminate_backend` or a dropped network path right after COMMIT looks
like to the caller: the server ran the statement and committed it, then the connection
died, so the client sees a connection error and cannot know the outcome. `LostAnswer` wraps
every Django connection of the test process (the current thread's and any opened later, in
another thread, e.g. the runner's keeper) with an execute wrapper: the first statement
`matches(sql, params)` accepts runs for real (in autocommit mode it commits), then the
wrapper shuts the connection's socket down and reads from it, so psycopg itself raises the
OperationalError the caller would get; the statement's rows are never returned.
`LostBeforeCommit` is the other side of the same unknown: the connection dies before the
statement is sent, so nothing commits and the caller sees the same error.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, connections
from django.db.backends.signals import connection_created
from psycopg.pq import TransactionStatus

Matcher = Callable[[str, Sequence[Any] | None], bool]


def cut(conn: Any) -> None:
    """Shut the Django connection's socket down and read from it: psycopg raises the
    connection error (wrapped as Django's OperationalError) a dead server gives."""
    raw = conn.connection
    sock = socket.socket(fileno=raw.fileno())
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()  # the descriptor stays psycopg's
    with conn.wrap_database_errors:
        raw.execute("SELECT 1")
    raise AssertionError("the connection survived its socket's shutdown")


class EveryConnection:
    """Installs `wrapper` (a Django execute wrapper) on every connection of the process while
    the block runs: those open now and those opened later, in any thread."""

    def __init__(self, wrapper: Callable[..., Any]) -> None:
        self.wrapper = wrapper
        self._wrapped: list[Any] = []

    def __enter__(self):
        connection_created.connect(self._on_connect, weak=False)
        for conn in [*connections.all(initialized_only=True), connection]:
            self._wrap(conn)
        return self

    def __exit__(self, *exc: object) -> None:
        connection_created.disconnect(self._on_connect)
        for conn in self._wrapped:
            if self.wrapper in conn.execute_wrappers:
                conn.execute_wrappers.remove(self.wrapper)

    def _on_connect(self, sender: object, connection: Any, **kwargs: object) -> None:
        self._wrap(connection)

    def _wrap(self, conn: Any) -> None:
        if self.wrapper not in conn.execute_wrappers:
            conn.execute_wrappers.append(self.wrapper)
            self._wrapped.append(conn)


class LostAnswer(EveryConnection):
    """The first `times` statements `matches` accepts commit, then lose their answer."""

    after_commit = True

    def __init__(
        self, matches: Matcher, *, times: int = 1, on_fire: Callable[[], object] | None = None
    ) -> None:
        super().__init__(self._fault)
        self.matches = matches
        self.on_fire = on_fire  # runs in the faulted thread before it sees the error
        self.left = times
        self.fired: list[str] = []  # the statements that met the fault
        self._lock = threading.Lock()

    def _fault(self, execute, sql, params, many, context):
        with self._lock:
            fire = self.left > 0 and self.matches(sql, params)
            if fire:
                self.left -= 1
                self.fired.append(sql)
        conn = context["connection"]
        if fire and self.on_fire is not None:
            self.on_fire()
        if fire and not self.after_commit:
            cut(conn)
        result = execute(sql, params, many, context)
        if fire:
            if conn.connection.info.transaction_status != TransactionStatus.IDLE:
                raise AssertionError(f"matched a statement inside a transaction: {sql}")
            cut(conn)  # it has committed: the caller never sees its rows
        return result


class LostBeforeCommit(LostAnswer):
    """The first `times` statements `matches` accepts meet a dead connection: not sent."""

    after_commit = False
