"""A claimer's floor on `run_after`: the due scan skips the dead head of the claim index.

While another session holds a snapshot (a report in REPEATABLE READ, a long pg_dump, a
forgotten BEGIN), every job claimed since leaves an entry at the head of jobs_job_claim_idx
whose heap tuple is dead but not removable, and a due scan from the head visited the heap
for each of them: ~100 ms a claim after 3 minutes at 1,000 jobs/s (issue 32, point 1).

The floor is a `run_after` below which this process's last scans saw no live due row. The
claim keeps `run_after >= floor`, an Index Cond on the index's second column that PostgreSQL
checks on the index tuple, so the dead entries below it cost no heap visit. A row the floor
could hide (a job given back with its old `run_after`, a back-dated INSERT, a row skipped
because another transaction held its lock, rows of a lower priority than the batch just
taken) is found by a full scan (no floor) at least every JOBS_CLAIM_FULL_SCAN_SECONDS: a
floor only delays, it never loses. The floor stays JOBS_CLAIM_FLOOR_MARGIN_SECONDS below
what a scan saw, so rows committed a little out of `run_after` order (concurrent producers,
a give-back right after a claim) are found by the next claim, not the next full scan.

One per process for the runner (a drain runs one claim at a time; the lock is for the
keeper's thread and for tests), like the connection it scans with; the wake-up listener
keeps its own for its due check (jobs/wakeup.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from jobs.conf import get_config


class ClaimFloor:
    """This process's floor, and when it last scanned the whole due set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floor: datetime | None = None
        self._full_scan_at = float("-inf")  # time.monotonic() of the last full scan

    def bound(self) -> datetime | None:
        """The floor for the next scan; None (scan in full) when there is none yet or the
        last full scan is JOBS_CLAIM_FULL_SCAN_SECONDS old."""
        full_scan_seconds = get_config().claim_full_scan_seconds
        with self._lock:
            if time.monotonic() - self._full_scan_at >= full_scan_seconds:
                return None
            return self._floor

    def current(self) -> datetime | None:
        """The floor, however old the last full scan (None: none yet)."""
        with self._lock:
            return self._floor

    def seconds_to_full_scan(self) -> float:
        """How long until `bound()` asks for a full scan again (0: the next one is)."""
        full_scan_seconds = get_config().claim_full_scan_seconds
        with self._lock:
            return max(0.0, self._full_scan_at + full_scan_seconds - time.monotonic())

    def saw(
        self,
        *,
        bound: datetime | None,
        run_afters: Iterable[datetime],
        scanned_at: datetime | None,
    ) -> None:
        """What a scan with `bound` saw: the `run_after` of each row it claimed and the
        database's clock it scanned at (None: it did not scan). Below the earliest of them
        it found no live due row that was not locked (the rows it took come first in claim
        order); none at all when it took nothing. A floored scan only raises the floor."""
        if scanned_at is None:
            return
        margin = timedelta(seconds=get_config().claim_floor_margin_seconds)
        seen = min([scanned_at, *run_afters]) - margin
        with self._lock:
            if bound is None:
                self._floor = seen
                self._full_scan_at = time.monotonic()
            elif self._floor is not None:
                self._floor = max(self._floor, seen)

    def forget(self) -> None:
        """No floor: the next scan is a full one (a test's fresh database)."""
        with self._lock:
            self._floor = None
            self._full_scan_at = float("-inf")


claim_floor = ClaimFloor()
