"""Which job kinds a claim should end with (issue 29, point 3: fetch what you will start).

A claim that takes quick jobs behind one that will run longer than
JOBS_HOLD_UNSTARTED_SECONDS only holds them until the keeper gives them back, to be claimed
again: every claim and give-back writes the row, its triggers and WAL. So the runner's
statement (`jobs_runner_step_v2`) ends a batch with the first job of a kind known to run
long. This module knows those kinds for its process: what the per-kind durations say (read
by jobs.kind_durations, at most every SLOW_KINDS_READ_SECONDS), and what the keeper has just
seen run long.
"""

from __future__ import annotations

import threading
import time

from jobs.kind_durations import job_kinds_slower_than

SLOW_KINDS_READ_SECONDS = 30.0  # seconds a process keeps the slow kinds before reading again


class SlowKinds:
    """The kinds that recently ran longer than JOBS_HOLD_UNSTARTED_SECONDS: a claim ends with
    the first of them (issue 29, point 3). Read by jobs.kind_durations, on the drain's
    connection, at most every SLOW_KINDS_READ_SECONDS per process (and again when the hold
    setting changes): one small indexed query, not one per claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: tuple[float, float, list[str]] = (float("-inf"), 0.0, [])  # at, hold, kinds

    def get(self, hold: float) -> list[str]:
        with self._lock:
            read_at, read_hold, kinds = self._read
            if read_hold == hold and time.monotonic() - read_at < SLOW_KINDS_READ_SECONDS:
                return kinds
        kinds = job_kinds_slower_than(seconds=hold)
        with self._lock:
            self._read = (time.monotonic(), hold, kinds)
        return kinds

    def known(self, kinds: list[str], *, hold: float) -> None:
        """Take `kinds` as just read (a test's fresh database has no durations yet)."""
        with self._lock:
            self._read = (time.monotonic(), hold, list(kinds))

    def saw_slow(self, kind: str) -> None:
        """A job of `kind` has just run longer than the hold (the keeper saw it): take the
        kind as slow until the next read, so a process whose durations are not known yet
        (a fresh database, a new kind) stops claiming behind it at once."""
        with self._lock:
            read_at, hold, kinds = self._read
            if kind not in kinds:
                self._read = (read_at, hold, [*kinds, kind])

    def forget(self) -> None:
        """Read again at the next claim."""
        with self._lock:
            self._read = (float("-inf"), 0.0, [])


slow_kinds = SlowKinds()
