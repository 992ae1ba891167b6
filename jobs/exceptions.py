"""Exceptions of the jobs app."""

from __future__ import annotations


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
