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
taken) is found by a full scan (no floor) every JOBS_CLAIM_FULL_SCAN_SECONDS, or, while the
snapshot makes full scans slow, every twenty times the last one's duration (FULL_SCAN_SHARE,
at most every FULL_SCAN_MAX_PERIOD_SECONDS): a floor only delays, it never loses. The floor
stays JOBS_CLAIM_FLOOR_MARGIN_SECONDS below what a scan saw, so rows committed a little out
of `run_after` order (concurrent producers, a give-back right after a claim) are found by
the next claim, not the next full scan.

A job committed below the floors (a producer's transaction that stayed open for seconds, a
job given back with its old `run_after`) is not left to the full scan: the wake-up listener
hears its NOTIFY and, within a qcluster, posts where it lies (jobs/floor_hints.py); the
runner's floor takes those hints before each scan and lowers itself to them (issue 36,
point 1). The full scan remains for what no NOTIFY tells (a row skipped while another
transaction held its lock) and for processes without a listener (`run_jobs`).

One per process for the runner (a drain runs one claim at a time; the lock is for the
keeper's thread and for tests), like the connection it scans with; the wake-up listener
keeps its own for its due check (jobs/wakeup.py), lowered by what it hears.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from jobs import floor_hints
from jobs.conf import get_config

# The most of a process's time its full scans may take. The full scan walks every dead entry
# an old snapshot keeps, so its cost grows with the pin (~200 ms after 10 minutes at 1,000
# jobs/s); once a second in each worker and in the listener, it was a third of a 2-core
# machine's time after 10 minutes, and all of it later. So the next full scan waits at least
# the last one's duration divided by this share: the full scans take at most a twentieth of
# the process's time, however long the pin (issue 32, point 1), and what a floor hides waits
# longer only while a snapshot makes the full scan slow.
FULL_SCAN_SHARE = 0.05
# The longest period that share may make: what `took` measures is the whole statement (its
# completions, a lock wait, a slow commit), so one statement stalled for minutes must not
# keep what a floor hides waiting for an hour.
FULL_SCAN_MAX_PERIOD_SECONDS = 30.0


class ClaimFloor:
    """This process's floor, and when it last scanned the whole due set. With `hinted`, it
    also takes the wake-up listener's hints (jobs/floor_hints.py) before each scan."""

    def __init__(self, *, hinted: bool = False) -> None:
        self._lock = threading.Lock()
        self._floor: datetime | None = None
        self._full_scan_at = float("-inf")  # time.monotonic() of the last full scan
        self._full_scan_took = 0.0  # seconds the last full scan's statement took
        self._hinted = hinted
        self._hints_read = floor_hints.posted() if hinted else 0

    def period(self) -> float:
        """Seconds between full scans: JOBS_CLAIM_FULL_SCAN_SECONDS, or longer while the
        last full scan was slow (FULL_SCAN_SHARE), up to FULL_SCAN_MAX_PERIOD_SECONDS."""
        with self._lock:
            return self._period_locked()

    def _period_locked(self) -> float:
        configured = get_config().claim_full_scan_seconds
        if configured <= 0:
            return 0.0  # every scan in full, as the setting says
        spaced = min(self._full_scan_took / FULL_SCAN_SHARE, FULL_SCAN_MAX_PERIOD_SECONDS)
        return max(configured, spaced)

    def bound(self) -> datetime | None:
        """The floor for the next scan; None (scan in full) when there is none yet or the
        last full scan is a period old (`period()`)."""
        with self._lock:
            if self._hinted:
                self._take_hints_locked()
            if time.monotonic() - self._full_scan_at >= self._period_locked():
                return None
            return self._floor

    def _take_hints_locked(self) -> None:
        """Lower the floor to the jobs the listener saw committed below it since the last
        look; scan in full if hints were lost (a reader more than floor_hints.RING behind)."""
        self._hints_read, earliest, lost = floor_hints.since(self._hints_read)
        if lost:
            self._full_scan_at = float("-inf")
        elif earliest is not None:
            self._lower_locked(datetime.fromtimestamp(earliest, UTC))

    def lower(self, seen: datetime) -> None:
        """A due job lies at or above `seen` (a NOTIFY said so): keep the floor the margin
        below it, so the next scan finds it."""
        with self._lock:
            self._lower_locked(seen)

    def _lower_locked(self, seen: datetime) -> None:
        seen -= timedelta(seconds=get_config().claim_floor_margin_seconds)
        if self._floor is not None and seen < self._floor:
            self._floor = seen

    def current(self) -> datetime | None:
        """The floor, however old the last full scan (None: none yet)."""
        with self._lock:
            return self._floor

    def seconds_to_full_scan(self) -> float:
        """How long until `bound()` asks for a full scan again (0: the next one is)."""
        with self._lock:
            return max(0.0, self._full_scan_at + self._period_locked() - time.monotonic())

    def saw(self, *, bound: datetime | None, seen: datetime | None, took: float = 0.0) -> None:
        """What a scan with `bound` saw: the `run_after` of the first row it found (the
        earliest of those it claimed), or the database's clock it scanned at when it found
        none (None: it did not scan), and how many seconds its statement took. Below `seen`
        it found no live due row that was not locked: the rows it took come first in claim
        order. A floored scan only raises the floor (unless the floor was lowered below
        `bound` meanwhile: what lowered it is still to be scanned); a full one sets it, even
        lower, and when the next full scan comes (`period()`)."""
        if seen is None:
            return
        seen -= timedelta(seconds=get_config().claim_floor_margin_seconds)
        with self._lock:
            if bound is None:
                self._floor = seen
                self._full_scan_at = time.monotonic()
                self._full_scan_took = max(0.0, took)
            elif self._floor is not None and self._floor >= bound:
                self._floor = max(self._floor, seen)

    def forget(self) -> None:
        """No floor: the next scan is a full one (a test's fresh database)."""
        with self._lock:
            self._floor = None
            self._full_scan_at = float("-inf")
            self._full_scan_took = 0.0
            if self._hinted:
                self._hints_read = floor_hints.posted()


claim_floor = ClaimFloor(hinted=True)
