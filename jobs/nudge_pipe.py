"""A pipe that wakes sleepers in a qcluster's other processes at once: opened in the main
process before django-q2 forks, so every process it forks inherits both ends. A nudge is a
byte; a sleeper selects on the read end with its timeout and takes every byte waiting, so a
nudge only moves a wake-up forward and a flood of nudges costs one read. Without the pipe
(`run_jobs`, tests that do not open it) `wait` simply sleeps.

Two are used: the lingering drains' (jobs/linger_signal.py) and django-q2's pusher's
(jobs/pusher_signal.py).
"""

from __future__ import annotations

import os
import select
import time


class NudgePipe:
    def __init__(self, *, every_seconds: float) -> None:
        self._pipe: tuple[int, int] | None = None  # (read end, write end), both non-blocking
        self._every = every_seconds  # at most one nudge this often: a flood costs little
        self._last_nudge = float("-inf")

    def open(self) -> None:
        if self._pipe is None:
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._pipe = (read, write)

    def close(self) -> None:
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    def nudge(self) -> None:
        """Wake the sleepers now (a no-op without the pipe, or within `every_seconds` of
        the last nudge: the sleepers woken then have not read yet)."""
        if self._pipe is None or time.monotonic() - self._last_nudge < self._every:
            return
        self._last_nudge = time.monotonic()
        try:
            os.write(self._pipe[1], b"!")
        except BlockingIOError:  # the pipe is full: plenty of nudges wait to be read already
            pass

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; return early, True, when nudged (taking the nudges
        waiting)."""
        if self._pipe is None:
            time.sleep(seconds)
            return False
        readable, _, _ = select.select([self._pipe[0]], [], [], seconds)
        if not readable:
            return False
        try:
            os.read(self._pipe[0], 65536)
        except BlockingIOError:  # another process's sleeper took them
            pass
        return True
