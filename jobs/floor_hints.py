"""The wake-up listener tells its qcluster's claimers where a committed job lies below their
floors (issue 36, point 1).

Each claimer scans from its floor (jobs/claim_floor.py): a `run_after` below which its last
scan saw no live due row. A job committed later with an older `run_after` lands below every
floor: a producer whose transaction stayed open for seconds (its `run_after` is its
transaction's start), a job given back with its old `run_after`. Only a full scan found it,
every JOBS_CLAIM_FULL_SCAN_SECONDS, and not at all once the drains had stopped: it waited
for the minute schedule. The jobs table's NOTIFY says, at the commit, the earliest
`run_after` a transaction made due (or the transaction's start, when that is earlier:
jobs/migrations/0016); the listener hears it, and when it lies below where a floor could be,
posts it here. Before each scan, a claimer lowers its floor to the hints posted since its
last look: a floor only delays until the next scan, never past it.

Shared memory opened in the qcluster's main process before django-q2 forks (every worker
inherits it), like the linger pipe (jobs/linger_signal.py): a ring of the last RING hints
and a count of hints ever posted, under one lock. One writer (the listener), a reader per
worker process, each keeping how far it read; a reader that fell more than RING behind
scans in full. Without it (`run_jobs`, tests that do not open it) nothing is posted and a
claimer relies on its full scans, as before.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

RING = 256  # hints kept; a reader this far behind scans in full instead


@dataclass
class _Shared:
    lock: object
    posted: object  # RawValue('q'): hints ever posted
    ring: object  # RawArray('d', RING): epoch seconds on the database's clock


_shared: _Shared | None = None


def open_hints() -> None:
    """In the qcluster's main process, before the cluster forks its workers."""
    global _shared
    if _shared is None:
        _shared = _Shared(
            lock=multiprocessing.Lock(),
            posted=multiprocessing.RawValue("q", 0),
            ring=multiprocessing.RawArray("d", RING),
        )


def close_hints() -> None:
    global _shared
    _shared = None


def is_open() -> bool:
    return _shared is not None


def post(epoch: float) -> None:
    """A due job committed with `run_after` at or above `epoch` (database epoch seconds)."""
    shared = _shared
    if shared is None:
        return
    with shared.lock:
        shared.ring[shared.posted.value % RING] = epoch
        shared.posted.value += 1


def since(read: int) -> tuple[int, float | None, bool]:
    """The hints posted after the first `read`: (how many have been posted now, the
    earliest of them or None, whether some were overwritten before this read)."""
    shared = _shared
    if shared is None:
        return read, None, False
    with shared.lock:
        posted = shared.posted.value
        if posted == read:
            return posted, None, False
        if posted - read > RING or posted < read:  # overwritten, or another ring
            return posted, None, True
        return posted, min(shared.ring[n % RING] for n in range(read, posted)), False


def posted() -> int:
    """How many hints have been posted (0 without the shared memory)."""
    shared = _shared
    if shared is None:
        return 0
    with shared.lock:
        return shared.posted.value
