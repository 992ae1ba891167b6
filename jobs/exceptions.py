"""Exceptions of the jobs app."""

from __future__ import annotations

import math
from datetime import timedelta


class JobError(Exception):
    """Base class of the jobs app's own errors."""


class PermanentJobError(JobError):
    """Raised by a handler: the job can never succeed, so it fails now instead of retrying."""


class InvalidPayload(PermanentJobError):
    """Raised by a handler that rejects its payload (a permanent failure)."""


class UnknownJobKind(PermanentJobError):
    """No handler is registered for the job's kind in this process."""


class LeaseLost(JobError):
    """This worker no longer owns the row (it was reaped): the attempt's work is rolled back."""


class InvalidSchedule(JobError, ValueError):
    """A `jobs.periodic` declaration that could never run as meant (raised at import)."""


class EnqueueError(JobError, TypeError, ValueError):
    """A producer's arguments the queue refuses (issue 38, point 9: a key of 10 MB, tags
    that are not strings, meta that is not a JSON object, a payload that is not JSON):
    raised before any statement is sent, so nothing is written and the caller's
    transaction stays usable. A TypeError and a ValueError too, as enqueue raised before."""


# The longest snooze: a job told to wait longer than this is a mistake (a Retry-After read in
# the wrong unit, a date taken for a delay), refused where it is made.
SNOOZE_MAX_SECONDS = 30 * 86400


class Snooze(JobError):  # noqa: N818 - the interface's name (issue 38, point 8)
    """Raised by a handler: run this job again in `seconds` (a number or a timedelta,
    0 to 30 days), without spending an attempt (issue 38, point 2).

    The job goes back to `queued`, due then; its attempt count is given back, its history
    row says "snoozed" and for how long. An atomic handler's transaction is rolled back, as
    for any exception. A job snoozes at most JOBS_MAX_SNOOZES times; the next snooze fails
    it with that reason. A value out of range is refused here, at construction (TypeError,
    ValueError), so the handler's attempt fails with that error instead of snoozing."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = snooze_seconds(seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")


def snooze_seconds(value: object) -> float:
    """`value` as a number of seconds to snooze, or TypeError / ValueError naming why not."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"jobs.Snooze takes a number of seconds or a timedelta, not "
            f"{type(value).__name__} {value!r:.100}"
        )
    if not math.isfinite(value):
        raise ValueError(f"jobs.Snooze: the seconds must be finite, not {value!r}")
    if not 0 <= value <= SNOOZE_MAX_SECONDS:
        raise ValueError(
            f"jobs.Snooze: the seconds must be between 0 and {SNOOZE_MAX_SECONDS} "
            f"(30 days), not {value!r}"
        )
    return float(value)


class JobTimedOut(JobError):
    """Recorded as a job's failure when its handler ran past its timeout (issue 37, point
    6): `timed out after N s`. Never raised into a handler: the runner asks it to stop (an
    async one's task is cancelled) and records this once the handler has returned."""


class JobCancelled(JobError):
    """Recorded as the reason of a job cancelled while it ran (issue 37, point 8)."""


class WorkerStopping(JobError):
    """Recorded for a job its process asked to stop because the process is stopping (SIGTERM,
    issue 37, point 9), or whose event loop another handler blocked: queued again at once
    with its attempt given back (jobs/stops.py): the worker stopped, the job did not fail."""
