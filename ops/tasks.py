"""Functions the qcluster schedules call that belong to no single app (paths in
ops/schedules.py)."""

from __future__ import annotations

from django.utils import timezone

from ops.job_periods import job_periods_prune
from ops.rollups import counters_roll_up
from ops.task_history import task_history_prune


def prune_task_history() -> int:
    """Delete django-q2 task results older than Q_TASK_RETENTION_DAYS; return how many."""
    return task_history_prune()


def prune_job_periods() -> int:
    """Delete the health page's per-kind 30-minute rows older than 8 days; return how many."""
    return job_periods_prune(now=timezone.now())


def roll_up_counters() -> int:
    """Fold the append-only counter deltas into the rolled-up tables (issue 32); return how
    many deltas moved."""
    return counters_roll_up()
