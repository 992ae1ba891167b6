"""A quiet log during an outage (invariant I24, STYLE.md point 7, issue 31 point 2).

With the database down, every loop of every worker process fails again and again: the
minter's lease renewal, the job drain and heartbeat, the poller, the sweeps, the process
beacon, the wake-up listener, django-q2's own scheduler, pusher and monitor. Logged per
attempt, with a traceback, an 80 s outage once wrote 91,000 lines (6.1 MB), and the first
useful line was lost in it.

`QuietLog` is the one rule all of them share. For one loop:

- the first failure of an outage is one line (a traceback only for an unexpected error, or
  at DEBUG: a lost connection is expected and its traceback tells nothing);
- later failures are counted, and at most one line per INTERVAL_SECONDS says how many
  ("... 57 more in the last 30 s");
- the first success after failures is one line saying the loop works again.

`QuietFilter` applies the same rule to a library's records (django-q2's) that carry a lost
connection: keyed by logger and function, it lets the first through and counts the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError

INTERVAL_SECONDS = 30.0  # seconds; at most one line per loop per interval during an outage

# A lost connection as the message of a library's log line (no exception attached): what
# libpq and psycopg say when the server is gone.
_LOST_CONNECTION_WORDS = (
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "the connection is closed",
    "connection is lost",
    "connection failed",
    "could not connect",
    "consuming input failed",
    "the database system is shutting down",
    "the database system is starting up",
    "no such file or directory\n\tis the server running",
    "is the server running",
)


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` is the loss of the connection, as opposed to a bad or unlucky statement.

    Judged from the error itself: after a failed `atomic()` Django has usually already
    dropped the dead connection and opened a new one, so the connection's state tells
    nothing. A lost connection is an OperationalError / InterfaceError raised by the client
    (no SQLSTATE: "server closed the connection unexpectedly", "the connection is closed",
    a failed connect) or by the server with a connection-exception (08xxx) or shutdown
    (57P01 admin shutdown, i.e. `pg_terminate_backend`, 57P02, 57P03) state. A statement
    timeout (57014), a lock timeout (55P03) or a serialization failure (40001) is not.
    psycopg's own errors (connections the project opens without Django) count the same.
    """
    import psycopg

    if isinstance(exc, InterfaceError | psycopg.InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
    elif isinstance(exc, psycopg.OperationalError):
        sqlstate = exc.sqlstate
    else:
        return False
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class QuietLog:
    """The log of one loop's repeated failures: one line, then a count per interval, then
    one line when it works again. Thread-safe (a loop and its helper threads may share it)."""

    def __init__(
        self,
        logger: logging.Logger,
        loop: str,
        *,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.loop = loop
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self.failures = 0  # in a row, since the last success
        self._unreported = 0  # failures not yet written as a line or counted in one
        self._last_line = 0.0  # monotonic time of the last line this loop wrote
        self._since = 0.0  # monotonic time of the first failure in a row

    def failed(
        self,
        exc: BaseException,
        message: str,
        *args: Any,
        then: str = "",
        extra: dict[str, Any] | None = None,
        expected: bool | None = None,
    ) -> bool:
        """Record a failure of the loop; return whether a line was written. The line reads
        `message % args`, the error's first line in brackets, `then` (what the loop does
        next), and on a repeat the count. `expected` defaults to "the connection was lost";
        an unexpected error gets its traceback on the first line of a run of failures."""
        expected = connection_lost(exc) if expected is None else expected
        now = self._clock()
        with self._lock:
            self.failures += 1
            first = self.failures == 1
            if first:
                self._since = now
            elif now - self._last_line < self.interval:
                self._unreported += 1
                return False
            repeats, self._unreported = self._unreported, 0
            self._last_line = now
            failures = self.failures
        text = f"{message % args if args else message} ({_first_line(exc)}){then}"
        if not first:
            text += f"; {repeats} more in the last {self.interval:.0f} s"
            text += f" (failing for {now - self._since:.0f} s)"
        debug = self.logger.isEnabledFor(logging.DEBUG)
        self.logger.log(
            logging.WARNING if expected else logging.ERROR,
            "%s",
            text,
            exc_info=exc if (debug or (first and not expected)) else None,
            extra={
                "action": "loop_failed",
                **(extra or {}),
                "loop": self.loop,
                "failures": failures,
                "repeats": repeats,
            },
        )
        return True

    def recovered(self, message: str = "working again", *, action: str = "loop_recovered") -> bool:
        """Record a success; after failures, one line says so. Returns whether it wrote one."""
        with self._lock:
            if not self.failures:
                return False
            failures, self.failures = self.failures, 0
            self._unreported = 0
            lasted = self._clock() - self._since
        self.logger.info(
            "%s: %s after %s failed %s in %.0f s",
            self.loop,
            message,
            failures,
            "try" if failures == 1 else "tries",
            lasted,
            extra={"action": action, "loop": self.loop, "failures": failures},
        )
        return True


class QuietFilter(logging.Filter):
    """Quiet a library's lines about a lost connection (django-q2's cluster, scheduler,
    pusher and monitor log each failed poll, with a traceback): per logger and function,
    the first passes, the rest are counted into one line per interval. Other lines pass."""

    def __init__(self, name: str = "", interval: float = INTERVAL_SECONDS) -> None:
        super().__init__(name)
        self.interval = interval
        self._runs: dict[tuple[str, str], _Run] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.split(".")[0] != "django-q":
            return True
        exc = record.exc_info[1] if record.exc_info else None
        lost = connection_lost(exc) if exc is not None else False
        if not lost:
            text = record.getMessage().lower()
            lost = any(words in text for words in _LOST_CONNECTION_WORDS)
        key = (record.name, record.funcName)
        now = time.monotonic()
        with self._lock:
            run = self._runs.get(key)
            if not lost:
                if run is not None and run.failures:
                    del self._runs[key]
                return True
            if run is None:
                run = self._runs[key] = _Run(first=now, last_line=now)
            run.failures += 1
            if run.failures > 1 and now - run.last_line < self.interval:
                run.unreported += 1
                return False
            repeats, run.unreported, run.last_line = run.unreported, 0, now
        if repeats:
            record.msg = f"{record.getMessage()}; {repeats} more in the last {self.interval:.0f} s"
            record.args = ()
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            record.exc_info = None  # an expected error: its traceback tells nothing
            record.exc_text = None
        return True


class _Run:
    __slots__ = ("failures", "first", "last_line", "unreported")

    def __init__(self, *, first: float, last_line: float) -> None:
        self.first = first
        self.last_line = last_line
        self.failures = 0
        self.unreported = 0
