"""Loaded (through PYTHONPATH) only by the tests' clock-skewed children (tests/support/skew.py).

libfaketime, with the monotonic clock left alone, turns Python's `time.sleep` (an absolute
`clock_nanosleep` on the monotonic clock) into EINVAL; `select` with a timeout is not
touched, so sleeping goes through it in those children. Nothing else changes.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
