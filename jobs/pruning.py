"""Retention per state (issue 38, point 6): completed, failed and cancelled jobs each kept
for their own number of days (JOBS_RETENTION_DAYS, JOBS_FAILED_RETENTION_DAYS,
JOBS_CANCELLED_RETENTION_DAYS), unique keys past their period and old `jobs.periodic`
tick rows, deleted in short batches; each run is recorded (`JobPruneRun`) for the health
page.

A tick row is the key that makes a tick enqueue one job across every qcluster (jobs/
periodic_scheduler.py), so pruning keeps what that needs: every tick for as long as the
longest job retention (at least a day: the key outlives its job's pruning, and a scheduler
that stalled between reading the clock and firing still finds its tick taken), and, however
old, each schedule's latest tick (where catch-up starts: nothing before it is ever fired
again) and its latest enqueued one (the overlap check asks whether that job still runs).

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
TICKS_KEPT_MIN_DAYS = 1.0

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

# Walks the primary key (schedule, tick_at): each row's schedule's latest tick and latest
# enqueued tick are a backward scan of the same index.
_DELETE_TICKS = """
DELETE FROM jobs_periodic_tick AS t USING (
    SELECT o.schedule, o.tick_at FROM jobs_periodic_tick AS o
    WHERE o.tick_at < now() - make_interval(secs => %(seconds)s)
      AND o.tick_at < (SELECT max(m.tick_at) FROM jobs_periodic_tick AS m
                       WHERE m.schedule = o.schedule)
      AND o.tick_at IS DISTINCT FROM (SELECT max(e.tick_at) FROM jobs_periodic_tick AS e
                                      WHERE e.schedule = o.schedule AND e.job_id IS NOT NULL)
    ORDER BY o.tick_at LIMIT {batch} FOR UPDATE SKIP LOCKED
) AS old
WHERE t.schedule = old.schedule AND t.tick_at = old.tick_at
"""

_DELETE_RUNS = "DELETE FROM jobs_jobprunerun WHERE ran_at < now() - make_interval(days => %s)"


@dataclass(frozen=True)
class PruneResult:
    completed: int
    failed: int
    cancelled: int
    unique_keys: int
    periodic_ticks: int = 0

    @property
    def total(self) -> int:
        return (
            self.completed + self.failed + self.cancelled + self.unique_keys + self.periodic_ticks
        )


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


def prune_periodic_ticks(*, batch: int = BATCH) -> int:
    """Delete the tick rows no tick's "one job" needs any more (see the module's docstring)."""
    config = get_config()
    days = max(
        config.retention_days,
        config.failed_retention_days,
        config.cancelled_retention_days,
        TICKS_KEPT_MIN_DAYS,
    )
    return _in_batches(_DELETE_TICKS.format(batch=int(batch)), {"seconds": days * 86400})


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
        periodic_ticks=prune_periodic_ticks(batch=batch),
    )
    with transaction.atomic():
        JobPruneRun.objects.create(
            completed=result.completed,
            failed=result.failed,
            cancelled=result.cancelled,
            unique_keys=result.unique_keys,
            periodic_ticks=result.periodic_ticks,
            seconds=round(time.monotonic() - started, 3),
        )
        with connection.cursor() as cursor:
            cursor.execute(_DELETE_RUNS, [RUNS_KEPT_DAYS])
    if result.total:
        logger.info(
            "jobs pruned: %s completed, %s failed, %s cancelled, %s expired unique keys, "
            "%s periodic ticks",
            result.completed,
            result.failed,
            result.cancelled,
            result.unique_keys,
            result.periodic_ticks,
            extra={"action": "jobs_pruned", "count": result.total},
        )
    return result


def last_prune_runs(limit: int = 24) -> list[JobPruneRun]:
    """The newest runs first (the health page)."""
    return list(JobPruneRun.objects.all()[:limit])
