"""A nudge from the wake-up listener to the qcluster's lingering drains (issue 29, point 5).

A drain that runs out of jobs lingers, reading the claim index every
JOBS_LINGER_POLL_SECONDS (jobs/drain.py). The listener, in the cluster's main process,
hears the jobs table's NOTIFY as soon as a job is committed; through a pipe opened before
django-q2 forks (every worker inherits it) it nudges the lingering drains, which read the
claim index at once instead of at their next poll. A nudge only moves a read forward, and
the listener nudges at most once per NUDGE_EVERY_SECONDS, so a flood of NOTIFYs from
another role cannot make the drains read the index more often than that.
Without the pipe (`run_jobs`, tests that do not open it, another start method) a
lingering drain simply sleeps its poll.
"""

from __future__ import annotations

import os
import select
import time

_pipe: tuple[int, int] | None = None  # (read end, write end), both non-blocking
NUDGE_EVERY_SECONDS = 0.01  # at most one nudge this often: a NOTIFY flood costs little
_last_nudge = float("-inf")


def open_signal() -> None:
    """In the qcluster's main process, before the cluster forks its workers."""
    global _pipe
    if _pipe is None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        _pipe = (read, write)


def close_signal() -> None:
    global _pipe
    if _pipe is not None:
        for fd in _pipe:
            os.close(fd)
        _pipe = None


def nudge() -> None:
    """Wake the lingering drains now (a no-op without the pipe, or within
    NUDGE_EVERY_SECONDS of the last nudge: the drains woken then have not read yet)."""
    global _last_nudge
    if _pipe is None or time.monotonic() - _last_nudge < NUDGE_EVERY_SECONDS:
        return
    _last_nudge = time.monotonic()
    try:
        os.write(_pipe[1], b"!")
    except BlockingIOError:  # the pipe is full: plenty of nudges wait to be read already
        pass


def wait(seconds: float) -> None:
    """Sleep up to `seconds`; return early when nudged (and take the nudges waiting)."""
    if _pipe is None:
        time.sleep(seconds)
        return
    readable, _, _ = select.select([_pipe[0]], [], [], seconds)
    if readable:
        try:
            os.read(_pipe[0], 65536)
        except BlockingIOError:  # another worker's drain took them
            pass
