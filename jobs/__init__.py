"""The background job loop.

Public interface: `from jobs import enqueue, enqueue_many, handler, periodic, run_pending,
EnqueueError, Snooze` (a handler raises `Snooze(seconds)` to run again later, issue 38).
"""

from __future__ import annotations

from typing import Any


# Each function imports its implementation when called: enqueueing, registry and runner import the
# models, and this package is imported while INSTALLED_APPS loads, before models may be.
def enqueue(kind: str, payload: dict[str, Any] | None = None, **options: Any):
    """Queue a job in the caller's transaction (it becomes visible with the caller's commit).

    Options: run_after (datetime), priority (int, higher first), max_attempts (int),
    unique_key (str) and unique_for (seconds), tags (list of str), meta (dict): see
    jobs/enqueueing.py. Raises EnqueueError for arguments the queue refuses.
    """
    from jobs.enqueueing import enqueue as _enqueue

    return _enqueue(kind, payload, **options)


def enqueue_many(kind: str, payloads, **options: Any) -> int:
    """Queue a job of `kind` per payload in one statement, in the caller's transaction;
    return how many it inserted (a payload whose unique key is taken is skipped). Options:
    enqueue's, with unique_keys (one per payload) instead of unique_key."""
    from jobs.enqueueing import enqueue_many as _enqueue_many

    return _enqueue_many(kind, payloads, **options)


def handler(kind: str, **options: Any):
    """Register the decorated function as the handler of `kind` jobs."""
    from jobs.registry import handler as _handler

    return _handler(kind, **options)


def periodic(kind: str, **options: Any):
    """Declare a job of `kind` per tick: `cron=` (with `tz=`) or `every=` seconds.

    In jobs/periodic_ticks.py: a module named jobs/periodic.py would shadow this function.
    """
    from jobs.periodic_ticks import periodic as _periodic

    return _periodic(kind, **options)


def run_pending(limit: int | None = None):
    """Drain due jobs in this process; return a summary."""
    from jobs.runner import run_pending as _run_pending

    return _run_pending(limit=limit)


from jobs.exceptions import EnqueueError, Snooze  # noqa: E402 - imports nothing of Django's

__all__ = [
    "EnqueueError",
    "Snooze",
    "enqueue",
    "enqueue_many",
    "handler",
    "periodic",
    "run_pending",
]
