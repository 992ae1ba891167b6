"""The operators' actions on jobs (the admin, the error groups page, `manage.py jobs_cancel`):
retry now, cancel (a running job: ask its worker to stop it), prune completed ones. Apart
from the runner's writes (jobs/runner_step.py, jobs/outcomes.py) because a person starts
these, on any number of rows at once, each as one UPDATE, and each leaves a log line.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Greatest, Now

from jobs.conf import get_config
from jobs.models import Job

logger = logging.getLogger(__name__)

Status = Job.Status


def jobs_retry_now(*, jobs: QuerySet[Job]) -> int:
    """Queue the given queued/failed/cancelled jobs to run now; one UPDATE for any number.

    A failed job gets one more attempt (max_attempts raised to attempts + 1 if needed), so
    `attempts <= max_attempts` keeps holding, and its snoozes back (issue 38: one that
    failed for snoozing too often may snooze again); running or completed jobs are left
    alone.
    """
    fields = {
        "status": Status.QUEUED,
        "snoozes": 0,
        "run_after": Now(),
        "failed_at": None,
        "cancelled_at": None,
        "cancel_requested_at": None,  # an old cancel must not stop the next attempt
        "max_attempts": Greatest(F("max_attempts"), F("attempts") + 1),
    }
    retryable = jobs.filter(status__in=[Status.QUEUED, Status.FAILED, Status.CANCELLED])
    with transaction.atomic():
        count = retryable.filter(unique_key__isnull=True).update(**fields)
        count += _retry_keyed(retryable.filter(unique_key__isnull=False), fields)
    logger.info("jobs retried now: %s", count, extra={"action": "jobs_retry_now"})
    return count


def _retry_keyed(jobs: QuerySet[Job], fields: dict[str, Any]) -> int:
    """Re-queue keyed jobs, but none whose key another queued or processing job holds, and
    one per (kind, key): the newest (issue 38: the partial unique index would refuse the
    whole UPDATE). A queued one is counted as before, left as it is but for run_after."""
    live = Job.objects.filter(
        kind=OuterRef("kind"),
        unique_key=OuterRef("unique_key"),
        status__in=[Status.QUEUED, Status.PROCESSING],
    ).exclude(pk=OuterRef("pk"))
    newest = (
        jobs.exclude(Exists(live))
        .order_by("kind", "unique_key", "-pk")
        .distinct("kind", "unique_key")
        .values("pk")
    )
    return Job.objects.filter(pk__in=Subquery(newest)).update(**fields)


def jobs_cancel(*, jobs: QuerySet[Job]) -> int:
    """Cancel the given queued or failed jobs (one UPDATE), and ask the workers running the
    given `processing` ones to stop them; return how many of either.

    Cancelling a failed job is how an operator says "stop reporting it, it will not be
    retried": without it a permanent failure could only be retried (and fail again).
    `failed_at` and `last_error` stay as history. A running job is its worker's until its
    handler stops (issue 37, point 8): `cancel_requested_at` is set, the worker's keeper
    sees it within CANCEL_POLL_SECONDS (jobs/stopping.py) and asks the handler to stop (an
    async one's task is cancelled), and the job ends `cancelled`, its attempt recorded, once
    the handler has returned (jobs/stops.py). A completed one has nothing left to cancel.
    """
    from jobs.stops import jobs_request_cancel

    with transaction.atomic():
        count = jobs.filter(status__in=[Status.QUEUED, Status.FAILED]).update(
            status=Status.CANCELLED, cancelled_at=Now()
        )
        asked = jobs_request_cancel(jobs=jobs)
    logger.info(
        "jobs cancelled: %s; running jobs asked to stop: %s",
        count,
        asked,
        extra={"action": "jobs_cancel", "cancelled": count, "asked_to_stop": asked},
    )
    return count + asked


def jobs_prune_completed(*, older_than_days: float | None = None, chunk: int = 5000) -> int:
    """Delete completed jobs finished more than the retention ago, in short batches (the
    other states' retention and the record of what was pruned: jobs/pruning.py)."""
    from jobs.pruning import prune_state

    days = get_config().retention_days if older_than_days is None else older_than_days
    return prune_state(Status.COMPLETED, days=days, batch=chunk)
