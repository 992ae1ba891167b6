"""The reaper: `processing` rows whose worker died (kill -9, OOM, a lost host) are reclaimed
after their lease ran out (I4): queued again with backoff, or failed when their attempts are
spent. Idempotent and safe to run from two workers at once. Called by the reap_stale_jobs
task and `manage.py reap_stale`; the other writes to the Job table are in services.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from jobs.backoff import retry_delay
from jobs.conf import get_config
from jobs.models import Job

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
    than that many seconds. On PostgreSQL this is one UPDATE over a `FOR UPDATE SKIP LOCKED`
    selection: two reapers at once each take disjoint rows, and a row whose worker is
    completing it right now (its lock held) is left alone; the UPDATE re-checks the status
    after any wait, so a row is never reaped twice.
    """
    now = timezone.now()
    stale = Job.objects.filter(status=Status.PROCESSING)
    if older_than is None:
        stale = stale.filter(lease_expires_at__lt=now)
        condition, cutoff = "lease_expires_at < %(cutoff)s", now
    else:
        cutoff = now - timedelta(seconds=older_than)
        stale = stale.filter(heartbeat_at__lt=cutoff)
        condition = "heartbeat_at < %(cutoff)s"
    if dry_run:
        return [
            ReapedJob.of(
                row,
                status=Status.FAILED if row.attempts >= row.max_attempts else Status.QUEUED,
                run_after=None,
            )
            for row in stale.order_by("id")
        ]
    note = f"reaped at {now:%Y-%m-%d %H:%M:%S} UTC: lease expired, worker "
    if connection.vendor == "postgresql":
        reaped = _reap_postgresql(condition=condition, cutoff=cutoff, now=now, note=note)
    else:
        reaped = _reap_generic(stale=stale, now=now, note=note)
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


_REAP_SQL = """
WITH stale AS (
    SELECT id, locked_by AS old_locked_by
    FROM jobs_job
    WHERE status = 'processing' AND {condition}
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs_job AS j SET
    status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
    failed_at = CASE WHEN j.attempts >= j.max_attempts THEN %(now)s ELSE NULL END,
    run_after = CASE WHEN j.attempts >= j.max_attempts THEN j.run_after ELSE
        %(now)s + make_interval(secs => LEAST(%(cap)s::float8,
            %(base)s::float8 * power(2, LEAST(GREATEST(j.attempts, 1) - 1, 60)))
            * (1 + random() * %(jitter)s::float8)) END,
    locked_by = '',
    lease_expires_at = NULL,
    last_error = %(note)s || stale.old_locked_by || ' stopped heartbeating (last heartbeat '
        || COALESCE(to_char(j.heartbeat_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), 'never')
        || ' UTC)'
FROM stale
WHERE j.id = stale.id AND j.status = 'processing'
RETURNING j.id, j.kind, j.attempts, j.max_attempts, stale.old_locked_by, j.status, j.run_after
"""


def _reap_postgresql(
    *, condition: str, cutoff: datetime, now: datetime, note: str
) -> list[ReapedJob]:
    config = get_config()
    params = {
        "cutoff": cutoff,
        "now": now,
        "cap": config.backoff_cap_seconds,
        "base": config.backoff_base_seconds,
        "jitter": config.backoff_jitter,
        "note": note,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_REAP_SQL.format(condition=condition), params)
        rows = cursor.fetchall()
    return sorted(
        (
            ReapedJob(
                id=pk,
                kind=kind,
                attempts=attempts,
                max_attempts=maximum,
                locked_by=locked_by,
                status=status,
                run_after=run_after if status == Status.QUEUED else None,
            )
            for pk, kind, attempts, maximum, locked_by, status, run_after in rows
        ),
        key=lambda job: job.id,
    )


def _reap_generic(*, stale: QuerySet[Job], now: datetime, note: str) -> list[ReapedJob]:
    """Backends without row locks (SQLite): the IMMEDIATE transaction holds the only write
    lock from BEGIN, so select-then-update inside it is as atomic as the single UPDATE."""
    reaped = []
    with transaction.atomic():
        for row in stale.order_by("id"):
            heartbeat = f"{row.heartbeat_at:%Y-%m-%d %H:%M:%S}" if row.heartbeat_at else "never"
            fields: dict[str, Any] = {
                "locked_by": "",
                "lease_expires_at": None,
                "last_error": f"{note}{row.locked_by} stopped heartbeating "
                f"(last heartbeat {heartbeat} UTC)",
            }
            if row.attempts >= row.max_attempts:
                fields.update(status=Status.FAILED, failed_at=now)
            else:
                fields.update(
                    status=Status.QUEUED,
                    run_after=now + timedelta(seconds=retry_delay(row.attempts)),
                )
            Job.objects.filter(pk=row.pk, status=Status.PROCESSING).update(**fields)
            reaped.append(
                ReapedJob.of(row, status=fields["status"], run_after=fields.get("run_after"))
            )
    return reaped
