"""django-q2's task history, capped (issue 21).

django-q2 keeps the results of its tasks in its `Task` table: successes are capped by
`Q_CLUSTER["save_limit"]` (it deletes the oldest past the limit), failures never are: a
task that fails every minute (a poll against a broken store) adds 1,440 rows a day for good.
`task_history_prune` deletes results of either kind older than `Q_TASK_RETENTION_DAYS`, in
short batches; the hourly schedule `ops.tasks.prune_task_history` runs it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django_q.models import Task

from ops.conf import get_config

logger = logging.getLogger(__name__)


def task_history_prune(
    *, now: datetime | None = None, older_than_days: float | None = None, batch_size: int = 1000
) -> int:
    """Delete django-q2 task results (successes and failures) stopped before the retention;
    returns how many."""
    now = now or timezone.now()
    days = get_config().task_retention_days if older_than_days is None else older_than_days
    cutoff = now - timedelta(days=days)
    total = 0
    while True:
        with transaction.atomic():
            ids = list(
                Task.objects.filter(stopped__lt=cutoff).values_list("pk", flat=True)[:batch_size]
            )
            if ids:
                Task.objects.filter(pk__in=ids).delete()
        total += len(ids)
        if len(ids) < batch_size:
            break
    if total:
        logger.info(
            "task history pruned: %s results stopped before %s",
            total,
            cutoff.isoformat(),
            extra={"action": "task_history_pruned", "count": total},
        )
    return total
