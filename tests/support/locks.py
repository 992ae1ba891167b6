"""Helpers for tests about row locks: hold a transaction open, and watch for lock waits.

A claim that uses `FOR UPDATE SKIP LOCKED` never waits for another transaction's row lock;
one that lost its `SKIP LOCKED` (or its row lock) does. The tests prove which by holding a
claim open on one connection, running the code under test on others (threads or processes),
and sampling from a third connection which backends of the test database wait on a lock
(`pg_stat_activity.wait_event_type = 'Lock'`, or a `pg_locks` entry not granted). That is an
observation, not a timing: a claim that waits on a held lock keeps waiting until it is
released, so the sampler cannot miss it.

A relation-extension lock (`wait_event = 'extend'`: two backends growing the same table file
at once) is not a lock any claim takes or skips; a loaded server shows it between any two
writers, so it is not counted as a wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

_WAITS_SQL = """
SELECT a.pid, coalesce(a.wait_event, ''), left(a.query, 300),
       coalesce((SELECT array_agg(DISTINCT c.relname::text ORDER BY c.relname::text)
                 FROM pg_locks AS t JOIN pg_class AS c ON c.oid = t.relation
                 WHERE t.pid = a.pid AND t.locktype = 'tuple'), '{}')
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND ((a.wait_event_type = 'Lock' AND a.wait_event <> 'extend')
       OR EXISTS (SELECT 1 FROM pg_locks AS l
                  WHERE l.pid = a.pid AND NOT l.granted AND l.locktype <> 'extend'))
"""


@dataclass(frozen=True)
class LockWait:
    pid: int
    wait_event: str
    query: str
    # The tables of the rows it waits for: a backend that finds a row locked by another
    # transaction takes that row's tuple lock, then waits for the transaction. Empty when
    # the wait is not for a row (or is the second in line for one).
    row_tables: tuple[str, ...] = ()

    def __str__(self) -> str:
        tables = f" (rows of {', '.join(self.row_tables)})" if self.row_tables else ""
        return f"pid {self.pid} waits on {self.wait_event or 'a lock'}{tables}: {self.query}"


class LockWaitWatcher(threading.Thread):
    """Samples lock waits on the test database every `interval` seconds until stopped.

    `on_first_wait` runs (once, on the watcher's thread) when the first wait is seen: a test
    passes the release of the transaction it holds, so that code which wrongly waits on it
    goes on (and shows what it does next) instead of hanging the test. Waits for which
    `ignore(wait)` is true are kept apart in `ignored` (a wait the test is not about).
    """

    def __init__(
        self,
        *,
        interval: float = 0.005,
        on_first_wait: Callable[[], None] | None = None,
        ignore: Callable[[LockWait], bool] | None = None,
    ) -> None:
        super().__init__(name="lock-wait-watcher", daemon=True)
        self.interval = interval
        self.on_first_wait = on_first_wait
        self.ignore = ignore
        self.waits: list[LockWait] = []
        self.ignored: list[LockWait] = []
        self.samples = 0
        self._stop_event = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> LockWaitWatcher:
        self.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)
        if self._error is not None:
            raise self._error

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                self._ready.set()
                while not self._stop_event.is_set():
                    cursor.execute(_WAITS_SQL)
                    found = [
                        LockWait(pid, event, query, tuple(tables))
                        for pid, event, query, tables in cursor.fetchall()
                    ]
                    self.samples += 1
                    if self.ignore is not None:
                        self.ignored.extend(w for w in found if self.ignore(w))
                        found = [w for w in found if not self.ignore(w)]
                    if found:
                        first = not self.waits
                        self.waits.extend(found)
                        if first and self.on_first_wait is not None:
                            self.on_first_wait()
                    time.sleep(self.interval)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread by stop()
            self._error = exc
            self._ready.set()
        finally:
            connection.close()

    def report(self) -> str:
        unique = {(w.pid, w.query): w for w in self.waits}
        return "\n".join(str(w) for w in unique.values())


class OpenTransaction(threading.Thread):
    """Runs `work` in a transaction on a connection of its own and keeps that transaction
    open, its row locks held, until `release()`; then commits it.

    This is a claim in flight on another worker: it has locked (and maybe updated) its rows
    and not committed yet.
    """

    def __init__(self, work: Callable[[], Any], *, hold_at_most: float = 120) -> None:
        super().__init__(name="open-transaction", daemon=True)
        self.work = work
        self.hold_at_most = hold_at_most
        self.result: Any = None
        self._held = threading.Event()
        self._release = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> OpenTransaction:
        self.start()
        if not self._held.wait(timeout=60):
            raise AssertionError("the open transaction did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        """Commit (idempotent; safe to call from the watcher's thread)."""
        self._release.set()
        if threading.current_thread() is not self:
            self.join(timeout=60)
        if self._error is not None:
            raise self._error

    @property
    def released(self) -> bool:
        return self._release.is_set()

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.result = self.work()
                self._held.set()
                self._release.wait(timeout=self.hold_at_most)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            self._error = exc
        finally:
            self._held.set()
            connection.close()
