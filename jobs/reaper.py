"""The reaper: `processing` rows whose worker died (kill -9, OOM, a lost host) are reclaimed
after their lease ran out (I4): queued again with backoff, or failed when their attempts are
spent. Idempotent and safe to run from two workers at once. Called by the reap_stale_jobs
task and `manage.py reap_stale`; the other writes to the Job table are in runner_step.py,
outcomes.py and operator_actions.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import QuerySet

from jobs.models import Job
from jobs.outcomes import job_retry_delay
from jobs.stops import given_up_reason
from project.db_clock import db_now

logger = logging.getLogger(__name__)

Status = Job.Status


@dataclass(frozen=True)
class ReapedJob:
    id: int
    kind: str
    attempts: int
    max_attempts: int
    locked_by: str  # the worker that stopped heartbeating
    status: str  # the new (or, in a dry run, would-be) status
    run_after: datetime | None

    @classmethod
    def of(cls, row: Job, *, status: str, run_after: datetime | None) -> ReapedJob:
        """The report line of a row as it was before reaping, with its new status."""
        return cls(
            id=row.pk,
            kind=row.kind,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            locked_by=row.locked_by,
            status=status,
            run_after=run_after,
        )

    def describe(self) -> str:
        then = f" run_after={self.run_after:%Y-%m-%d %H:%M:%S}" if self.run_after else ""
        return (
            f"#{self.id} {self.kind} attempts {self.attempts}/{self.max_attempts} "
            f"(was {self.locked_by or '?'}) -> {self.status}{then}"
        )


def jobs_reap_stale(*, older_than: float | None = None, dry_run: bool = False) -> list[ReapedJob]:
    """Reclaim `processing` rows whose worker died: queued again with backoff, or failed when
    their attempts are used up (the attempt was counted at claim, so reaping costs one).

    Stale means the lease expired, or with `older_than` that the last heartbeat is older
    than that many seconds. One transaction: a `FOR UPDATE SKIP LOCKED` selection, then one
    UPDATE of exactly those rows. Two reapers at once each take disjoint rows, and a row
    whose worker is completing it right now (its lock held) is left alone; the UPDATE
    re-checks the status, so a row is never reaped twice. The outcome of each row (status,
    backoff) is decided in Python, by the same rules as a failed attempt, from the
    database's clock (a host's may be minutes off).
    """
    now = db_now()
    stale = Job.objects.filter(status=Status.PROCESSING)
    if older_than is None:
        stale = stale.filter(lease_expires_at__lt=now)
    else:
        stale = stale.filter(heartbeat_at__lt=now - timedelta(seconds=older_than))
    stale = stale.order_by("id")
    if dry_run:
        return [
            ReapedJob.of(
                row,
                status=Status.FAILED if row.attempts >= row.max_attempts else Status.QUEUED,
                run_after=None,
            )
            for row in stale
        ]
    reaped = _reap(stale=stale, now=now)
    for job in reaped:
        logger.warning(
            "job reaped: %s",
            job.describe(),
            extra={
                "action": "job_reaped",
                "job_id": job.id,
                "kind": job.kind,
                "attempt": job.attempts,
            },
        )
    return reaped


_REAP_UPDATE_SQL = f"""
UPDATE {Job._meta.db_table} AS j
SET status = d.status, failed_at = d.failed_at, run_after = COALESCE(d.run_after, j.run_after),
    locked_by = '', lease_expires_at = NULL, last_error = d.last_error,
    cancelled_at = CASE WHEN d.status = '{Status.CANCELLED}' THEN d.at ELSE j.cancelled_at END
FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::text[],
            %s::timestamptz[])
    AS d(id, status, failed_at, run_after, last_error, at)
WHERE j.id = d.id AND j.status = '{Status.PROCESSING}'
RETURNING j.id
"""


def _reap(*, stale: QuerySet[Job], now: datetime) -> list[ReapedJob]:
    note = f"reaped at {now:%Y-%m-%d %H:%M:%S} UTC: lease expired, worker "
    with transaction.atomic():
        rows = list(
            stale.select_for_update(skip_locked=True).values_list(
                "id",
                "kind",
                "attempts",
                "max_attempts",
                "locked_by",
                "heartbeat_at",
                "last_error",
                "cancel_requested_at",
            )
        )
        if not rows:
            return []
        planned, errors = [], []
        for pk, kind, attempts, maximum, locked_by, heartbeat_at, last, cancel in rows:
            exhausted = attempts >= maximum
            heartbeat = f"{heartbeat_at:%Y-%m-%d %H:%M:%S}" if heartbeat_at else "never"
            error = f"{note}{locked_by} stopped heartbeating (last heartbeat {heartbeat} UTC)"
            # Issue 37: a process that gave up on a hung handler wrote why (a timeout, a
            # cancel) before it retired; an operator's cancel request ends the job cancelled.
            reason = given_up_reason(last, attempts)
            errors.append(error if reason is None else f"{reason}\n{error}")
            status = Status.FAILED if exhausted else Status.QUEUED
            if cancel is not None:
                status = Status.CANCELLED
            planned.append(
                ReapedJob(
                    id=pk,
                    kind=kind,
                    attempts=attempts,
                    max_attempts=maximum,
                    locked_by=locked_by,
                    status=status,
                    run_after=None
                    if status != Status.QUEUED
                    else now + timedelta(seconds=job_retry_delay(attempts)),
                )
            )
        with connection.cursor() as cursor:
            cursor.execute(
                _REAP_UPDATE_SQL,
                [
                    [job.id for job in planned],
                    [job.status for job in planned],
                    [now if job.status == Status.FAILED else None for job in planned],
                    [job.run_after for job in planned],
                    errors,
                    [now for _job in planned],
                ],
            )
            updated = {row[0] for row in cursor.fetchall()}
    return [job for job in planned if job.id in updated]


def job_reap(*, job_id: int) -> ReapedJob | None:
    """Reap one job from its admin page (issue 20): the same rules and statement as the
    reaper's, and only if it is still `processing` past its lease; None otherwise."""
    now = db_now()
    stale = Job.objects.filter(pk=job_id, status=Status.PROCESSING, lease_expires_at__lt=now)
    reaped = _reap(stale=stale, now=now)
    for job in reaped:
        logger.warning(
            "job reaped by an operator: %s",
            job.describe(),
            extra={"action": "job_reaped", "job_id": job.id, "kind": job.kind},
        )
    return reaped[0] if reaped else None
