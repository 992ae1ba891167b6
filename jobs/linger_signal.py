"""A nudge from the wake-up listener to the qcluster's lingering drains (issue 29, point 5),
and the drains' sign of life the listener reads (issue 37, point 1).

A drain that runs out of jobs lingers, reading the claim index every
JOBS_LINGER_POLL_SECONDS (jobs/drain.py). The listener, in the cluster's main process,
hears the jobs table's NOTIFY as soon as a job is committed; through a pipe opened before
django-q2 forks (every worker inherits it; jobs/nudge_pipe.py) it nudges the lingering
drains, which read the claim index at once instead of at their next poll. A nudge only
moves a read forward, and the listener nudges at most once per NUDGE_EVERY_SECONDS, so a
flood of NOTIFYs from another role cannot make the drains read the index more often than
that. Without the pipe (`run_jobs`, tests that do not open it, another start method) a
lingering drain simply sleeps its poll.

The listener waits a moment after a NOTIFY before it sends a wake task, because a
lingering drain takes the job within its poll and a wake task would end that linger. With
no drain running at all (the cluster idle past its lingers) that moment is lost time: each
drain stamps the monotonic clock (system-wide on Linux) into shared memory whenever it
looks for jobs, and the listener waits only when a drain looked within ACTIVE_SECONDS.
A drain that was killed simply stops stamping.
"""

from __future__ import annotations

import multiprocessing
import time

from jobs.nudge_pipe import NudgePipe

NUDGE_EVERY_SECONDS = 0.01  # at most one nudge this often: a NOTIFY flood costs little
# A drain that looked for jobs this recently is taken as running (a lingering one looks
# every JOBS_LINGER_POLL_SECONDS, 50 ms; a busy one at each of its statements).
ACTIVE_SECONDS = 0.25

_pipe = NudgePipe(every_seconds=NUDGE_EVERY_SECONDS)
_last_active: object | None = None  # RawValue('d'): time.monotonic() of a drain's last look


def open_signal() -> None:
    """In the qcluster's main process, before the cluster forks its workers."""
    global _last_active
    _pipe.open()
    if _last_active is None:
        _last_active = multiprocessing.RawValue("d", float("-inf"))


def close_signal() -> None:
    global _last_active
    _pipe.close()
    _last_active = None


def nudge() -> None:
    """Wake the lingering drains now (a no-op without the pipe, or within
    NUDGE_EVERY_SECONDS of the last nudge: the drains woken then have not read yet)."""
    _pipe.nudge()


def wait(seconds: float) -> bool:
    """Sleep up to `seconds`; return early, True, when nudged (taking the nudges waiting)."""
    return _pipe.wait(seconds)


def looking() -> None:
    """A drain looks for jobs now (a claim, a linger poll): stamp it for the listener. One
    8-byte store, no lock: a torn read is not possible for an aligned double on the
    platforms this runs on, and a stale one only makes the listener wait or not once."""
    if _last_active is not None:
        _last_active.value = time.monotonic()


def drains_running() -> bool:
    """Whether a drain of this cluster looked for jobs within ACTIVE_SECONDS; True without
    the shared memory (nothing known: keep the listener's wait)."""
    if _last_active is None:
        return True
    return time.monotonic() - _last_active.value < ACTIVE_SECONDS
