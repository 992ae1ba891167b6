"""Keeping long-lived loops alive across lost database connections.

A worker runs for weeks; in that time PostgreSQL restarts, fails over, or an operator
terminates its backends (`pg_terminate_backend`). Django does not reconnect by itself inside
a loop: a connection that died stays in `connection.connection` and every later query fails
with `OperationalError: terminating connection` / `the connection is closed`. Django only
drops unusable connections at request boundaries (and django-q2 before each task), which a
command's `while True` or a heartbeat thread never reaches.

So every long-lived loop (the job drain, `run_jobs`, `poll_inbound_email`, the job heartbeat)
does the same three things after a failure: drop the broken connection (the next query opens
a fresh one), wait an exponentially growing, capped, jittered delay (logged, so an operator
sees the outage and its end), and go on. Only a configuration error or a signal ends it.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from project.backoff import retry_delay
from project.quiet_log import QuietLog, connection_lost

__all__ = ["Reconnect", "connection_lost", "discard_broken_connection", "service_loop"]

logger = logging.getLogger(__name__)

RECONNECT_BASE_SECONDS = 0.5  # seconds; the first wait after a failure
RECONNECT_CAP_SECONDS = 30.0  # seconds; the longest wait between tries
RECONNECT_JITTER = 0.25  # fraction of the delay added at random (loops do not retry in step)


def server_ended(conn: psycopg.Connection) -> bool:
    """Whether the server has ended an idle psycopg connection (a restart, a failover,
    `pg_terminate_backend`), without sending anything: an idle connection has nothing to
    read unless its server closed it (or wrote a notice, which costs only a reconnect), so a
    zero-timeout poll tells. poll(), not select(): a process with hundreds of async tasks
    has descriptors past select()'s 1024."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return conn.closed or bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):  # the socket is already closed
        return True


def discard_broken_connection(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Close this thread's connection if it no longer works; return whether it was closed.

    Inside a transaction the connection is left alone: the caller's `atomic()` must unwind
    first (its rollback fails on a dead connection and Django then closes it).
    """
    conn = connections[alias]
    if conn.in_atomic_block or conn.connection is None or not conn.errors_occurred:
        return False  # no database error since it was opened: nothing to check
    if conn.is_usable():
        return False
    conn.close()
    return True


class Reconnect:
    """The backoff of one loop between tries after a failure.

    `failed()` drops a broken connection, logs, and returns how long to wait before the next
    try: `min(cap, base * 2**(n-1))` plus jitter for the n-th failure in a row. `recovered()`
    after a success resets the count (and logs that the outage ended).
    """

    def __init__(
        self,
        what: str,
        *,
        base: float = RECONNECT_BASE_SECONDS,
        cap: float = RECONNECT_CAP_SECONDS,
        alias: str = DEFAULT_DB_ALIAS,
    ) -> None:
        self.what = what
        self.base = base
        self.cap = cap
        self.alias = alias
        self.failures = 0  # in a row
        self.quiet = QuietLog(logger, what)  # one line, then a count per 30 s (I24)

    def failed(self, exc: BaseException) -> float:
        self.failures += 1
        lost = connection_lost(exc)
        if lost:
            discard_broken_connection(self.alias)
        delay = retry_delay(self.failures, base=self.base, cap=self.cap, jitter=RECONNECT_JITTER)
        extra = {
            "action": "db_reconnect" if lost else "loop_error",
            "attempt": self.failures,
            "delay_seconds": round(delay, 3),
        }
        if lost:
            self.quiet.failed(
                exc, "%s: database connection lost", self.what, then="; reconnecting", extra=extra
            )
        else:
            self.quiet.failed(exc, "%s failed", self.what, then="; trying again", extra=extra)
        return delay

    def recovered(self) -> None:
        self.quiet.recovered(action="db_reconnected")
        self.failures = 0


def service_loop(
    step: Callable[[], Any],
    *,
    what: str,
    stop: threading.Event,
    idle_seconds: Callable[[Any], float],
    reconnect: Reconnect | None = None,
) -> None:
    """Call `step()` until `stop` is set, waiting `idle_seconds(result)` between calls.

    The loop's one broad `except`: any error (a lost connection, S3 down, a bug in one pass)
    is logged with its context, the broken connection dropped, and the loop goes on after
    the backoff. A configuration error (ImproperlyConfigured) ends it, since no retry can
    fix it; KeyboardInterrupt / SystemExit pass through (they are not Exceptions).
    """
    reconnect = reconnect or Reconnect(what)
    while not stop.is_set():
        try:
            result = step()
        except ImproperlyConfigured:
            raise
        except Exception as exc:  # noqa: BLE001 - the loop's one catch-all: drop the connection, log, back off, go on
            stop.wait(reconnect.failed(exc))
            continue
        reconnect.recovered()
        wait = idle_seconds(result)
        if wait > 0:
            stop.wait(wait)


def sleep_until(deadline: float | None, delay: float, stop: threading.Event | None) -> bool:
    """Wait `delay` seconds unless that passes `deadline` (monotonic) or `stop` is set;
    return whether the caller may try again."""
    if deadline is not None and time.monotonic() + delay >= deadline:
        return False
    if stop is None:
        time.sleep(delay)
        return True
    return not stop.wait(delay)
