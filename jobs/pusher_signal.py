"""A nudge from the wake-up listener to django-q2's pusher (issue 37, point 1).

A qcluster worker whose drain has ended waits on django-q2's task queue, which the pusher
fills from the ORM broker; when the broker is empty the pusher sleeps Q_POLL (0.2 s) before
it asks again. So a job committed into an idle cluster waited up to that poll after the
listener had sent its wake task: a p95 of about 200 ms for the first job of a burst after an
idle spell. The listener (or a drain asking for another worker) nudges the pusher through a
pipe opened before django-q2 forks, right after the wake task's row is committed; the
broker (ops.task_guard.GuardedOrmBroker) sleeps on that pipe instead, so the pusher reads the
row at once. Without the pipe (no qcluster) the broker sleeps its poll as before.
"""

from __future__ import annotations

from jobs.nudge_pipe import NudgePipe

# A nudge per wake task; at most workers + 1 are outstanding, so nudges are few anyway.
_pipe = NudgePipe(every_seconds=0.0)


def open_signal() -> None:
    """In the qcluster's main process, before the cluster forks the pusher."""
    _pipe.open()


def close_signal() -> None:
    _pipe.close()


def nudge() -> None:
    _pipe.nudge()


def wait(seconds: float) -> bool:
    """The broker's sleep between empty polls; True when nudged."""
    return _pipe.wait(seconds)
