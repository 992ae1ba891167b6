"""The qcluster's stop, told to its workers' drains (issue 37, point 9).

`docker stop` sends SIGTERM to the qcluster's main process only; django-q2 then stops its
cluster, waiting for each worker's running task, a drain that would go on claiming until
JOBS_DRAIN_SECONDS. A byte of shared memory, opened before django-q2 forks (every worker
inherits it, as the listener's pipes), carries the stop: the main process sets it on
SIGTERM or SIGINT before django-q2's own handler runs, and each drain reads it as its
`stop` event: it stops claiming, gives back what it has not started, lets its running slots
finish for JOBS_SHUTDOWN_GRACE_SECONDS, then asks them to stop (jobs/stopping.py). Without
the shared byte (`run_jobs`, which has its own SIGTERM handler; a test) there is no event.
"""

from __future__ import annotations

import mmap
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

_flag: mmap.mmap | None = None
POLL_SECONDS = 0.05  # how often a wait reads the flag


def open_flag() -> None:
    """In the qcluster's main process, before the cluster forks its workers."""
    global _flag
    if _flag is None:
        _flag = mmap.mmap(-1, 1)  # anonymous and shared: the forked workers see its writes


def close_flag() -> None:
    global _flag
    if _flag is not None:
        _flag.close()
        _flag = None


class ClusterStop(threading.Event):
    """The shared byte as the runner's `stop` event (`is_set`, `wait`, `set` read and write
    the byte; the Event's own state is unused)."""

    def __init__(self, flag: mmap.mmap) -> None:
        super().__init__()
        self._shared = flag

    def is_set(self) -> bool:
        return self._shared[0] == 1

    def set(self) -> None:
        self._shared[0] = 1

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = POLL_SECONDS if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_SECONDS, left))
        return True


def stop_event() -> ClusterStop | None:
    """The drain's stop event in a qcluster worker; None where no flag was opened."""
    return None if _flag is None else ClusterStop(_flag)


def tell_workers_on_signals() -> None:
    """In the main process, after django-q2 installed its handlers: SIGTERM and SIGINT set
    the flag first, then stop the cluster as django-q2's handler does."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        signal.signal(signum, _setting_flag_then(previous))


def _setting_flag_then(previous: Any) -> Callable[[int, Any], None]:
    def handle(signum: int, frame: Any) -> None:
        event = stop_event()
        if event is not None:
            event.set()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.default_int_handler(signum, frame)

    return handle
