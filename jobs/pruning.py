"""Retention per state (issue 38, point 6): completed, failed and cancelled jobs each kept
for their own number of days (JOBS_RETENTION_DAYS, JOBS_FAILED_RETENTION_DAYS,
JOBS_CANCELLED_RETENTION_DAYS), and unique keys past their period, deleted in short
batches; each run is recorded (`JobPruneRun`) for the health page.

A batch is one DELETE of at most `batch` rows picked by the state's index (`FOR UPDATE SKIP
LOCKED`: a row an operator's action holds is left for the next run), committed on its own:
no lock is held longer than one batch, and a batch never waits for a row. The cutoffs are
on the database's clock. The qcluster's hourly schedule runs it (jobs.tasks).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import connection, transaction

from jobs.conf import get_config
from jobs.models import Job, JobPruneRun

logger = logging.getLogger(__name__)

BATCH = 1000
RUNS_KEPT_DAYS = 30

# Each state's timestamp, and the index its batches walk.
_STAMP = {
    Job.Status.COMPLETED: "completed_at",  # jobs_job_finished_idx (status, completed_at)
    Job.Status.FAILED: "failed_at",  # jobs_job_failed_at_idx WHERE status = 'failed'
    Job.Status.CANCELLED: "cancelled_at",  # jobs_job_cancelled_at_idx (migration 0020)
}

_DELETE_JOBS = """
DELETE FROM jobs_job WHERE id IN (
    SELECT id FROM jobs_job
    WHERE status = %(status)s AND {stamp} < now() - make_interval(secs => %(seconds)s)
    ORDER BY {stamp} LIMIT {batch} FOR UPDATE SKIP LOCKED)
  AND status = %(status)s
"""

_DELETE_KEYS = """
DELETE FROM jobs_jobuniquekey WHERE id IN (
    SELECT id FROM jobs_jobuniquekey WHERE expires_at <= clock_timestamp()
    ORDER BY expires_at LIMIT {batch} FOR UPDATE SKIP LOCKED)
"""

_DELETE_RUNS = "DELETE FROM jobs_jobprunerun WHERE ran_at < now() - make_interval(days => %s)"


@dataclass(frozen=True)
class PruneResult:
    completed: int
    failed: int
    cancelled: int
    unique_keys: int

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled + self.unique_keys


def _in_batches(sql: str, params: dict | list) -> int:
    total = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            deleted = cursor.rowcount
        total += deleted
        if deleted == 0:
            return total


def prune_state(status: str, *, days: float, batch: int = BATCH) -> int:
    """Delete the jobs in `status` whose state began more than `days` ago; return how many."""
    stamp = _STAMP[Job.Status(status)]
    sql = _DELETE_JOBS.format(stamp=stamp, batch=int(batch))
    return _in_batches(sql, {"status": status, "seconds": float(days) * 86400})


def jobs_prune(*, batch: int = BATCH) -> PruneResult:
    """Prune every state past its retention and the expired unique keys; record the run."""
    config = get_config()
    started = time.monotonic()
    result = PruneResult(
        completed=prune_state(Job.Status.COMPLETED, days=config.retention_days, batch=batch),
        failed=prune_state(Job.Status.FAILED, days=config.failed_retention_days, batch=batch),
        cancelled=prune_state(
            Job.Status.CANCELLED, days=config.cancelled_retention_days, batch=batch
        ),
        unique_keys=_in_batches(_DELETE_KEYS.format(batch=int(batch)), []),
    )
    with transaction.atomic():
        JobPruneRun.objects.create(
            completed=result.completed,
            failed=result.failed,
            cancelled=result.cancelled,
            unique_keys=result.unique_keys,
            seconds=round(time.monotonic() - started, 3),
        )
        with connection.cursor() as cursor:
            cursor.execute(_DELETE_RUNS, [RUNS_KEPT_DAYS])
    if result.total:
        logger.info(
            "jobs pruned: %s completed, %s failed, %s cancelled, %s expired unique keys",
            result.completed,
            result.failed,
            result.cancelled,
            result.unique_keys,
            extra={"action": "jobs_pruned", "count": result.total},
        )
    return result


def last_prune_runs(limit: int = 24) -> list[JobPruneRun]:
    """The newest runs first (the health page)."""
    return list(JobPruneRun.objects.all()[:limit])
