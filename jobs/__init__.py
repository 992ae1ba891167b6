"""The background job loop.

Public interface: `from jobs import enqueue, handler, periodic, run_pending`.
"""

from __future__ import annotations

from typing import Any


# Each function imports its implementation when called: services, registry and runner import the
# models, and this package is imported while INSTALLED_APPS loads, before models may be.
def enqueue(kind: str, payload: dict[str, Any] | None = None, **options: Any):
    """Queue a job in the caller's transaction (it becomes visible with the caller's commit).

    Options: run_after (datetime), priority (int, higher first), max_attempts (int).
    """
    from jobs.services import enqueue as _enqueue

    return _enqueue(kind, payload, **options)


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


__all__ = ["enqueue", "handler", "periodic", "run_pending"]
