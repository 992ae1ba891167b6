"""Functions the qcluster schedules call that belong to no single app (paths in
ops/schedules.py)."""

from __future__ import annotations

from ops.task_history import task_history_prune


def prune_task_history() -> int:
    """Delete django-q2 task results older than Q_TASK_RETENTION_DAYS; return how many."""
    return task_history_prune()
