"""Reads of the Job table that more than one entry point needs (admin, reaper, worker_status,
the health page, /metrics): each rule about what a job's state means lives here once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Case, Count, F, Q, QuerySet, Subquery, Sum, When

from jobs.models import Job, JobAttempt, JobCount, JobCountDelta
from project.pg_time import DateBin


def _kind_status_counts() -> dict[tuple[str, str], int]:
    """{(kind, status): rows} from the rolled-up JobCount and the deltas not rolled up yet
    (JobCountDelta, issue 32), in one statement: one snapshot, so a rollup that commits
    meanwhile is counted once, before or after. No scan of the jobs table, whatever its size;
    the deltas are at most a minute of statements."""
    rolled = JobCount.objects.values_list("kind", "status").annotate(total=Sum("n")).order_by()
    pending = (
        JobCountDelta.objects.values_list("kind", "status").annotate(total=Sum("n")).order_by()
    )
    counts: dict[tuple[str, str], int] = {}
    for kind, status, total in rolled.union(pending, all=True):
        counts[kind, status] = counts.get((kind, status), 0) + total
    return counts


def job_status_counts() -> dict[str, int]:
    """Rows per status, every status present (zero if none), from the trigger-kept counts."""
    by_status = dict.fromkeys(Job.Status.values, 0)
    for (_, status), n in _kind_status_counts().items():
        by_status[status] = by_status.get(status, 0) + n
    return by_status


def job_counts_by_kind() -> dict[str, dict[str, int]]:
    """{kind: {status: rows}} for the statuses a kind has rows in, kinds in name order (from
    the trigger-kept counts)."""
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, status), n in sorted(_kind_status_counts().items()):
        if n > 0:
            by_kind.setdefault(kind, {})[status] = n
    return by_kind


def job_kind_caps() -> list[dict[str, int | str]]:
    """Each capped kind (issue 37, point 2): its cap and its units in use now (its processing
    rows, counted on jobs_job_running_kind_idx: a few rows, whatever its backlog), in kind
    order; one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.kind, c.concurrency, (SELECT count(*) FROM jobs_job AS j "
            "WHERE j.kind = c.kind AND j.status = 'processing') FROM jobs_kindcap AS c "
            "ORDER BY c.kind"
        )
        return [
            {"kind": kind, "concurrency": cap, "running": running}
            for kind, cap, running in cursor.fetchall()
        ]


def job_kind_rates() -> list[dict[str, Any]]:
    """Each rate-limited kind (issue 38, point 3): its rate, its bucket's next token time,
    and the seconds until it (0: a token is there now; the database's clock), in kind
    order; one statement over the bucket rows, nothing over the jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT b.kind, b.rate, 1 / b.interval_seconds, b.next_slot_at, greatest(0, "
            "extract(epoch FROM b.next_slot_at - clock_timestamp()))::float8 "
            "FROM jobs_kindrate AS b ORDER BY b.kind"
        )
        return [
            {
                "kind": kind,
                "rate": rate,
                "per_second": per_second,
                "next_token_at": None if at is None else at.isoformat(),
                "next_token_in_seconds": in_seconds or 0.0,
            }
            for kind, rate, per_second, at, in_seconds in cursor.fetchall()
        ]


def jobs_due(*, now: datetime) -> QuerySet[Job]:
    """Queued rows whose time has come: what the runner should be working through."""
    return Job.objects.filter(status=Job.Status.QUEUED, run_after__lte=now)


def job_oldest_due(*, now: datetime) -> Job | None:
    """The due row that has waited longest (only id, kind, run_after loaded), or None.

    One query, the row found by a subquery that reads only the claim index (run_after, id),
    then loaded by its key: ordering the due rows themselves fetched every one from the heap
    for its kind (~90 ms with 10,000 due rows, bench/console.py)."""
    oldest = jobs_due(now=now).order_by("run_after", "id").values("pk")[:1]
    return Job.objects.filter(pk=Subquery(oldest)).only("id", "kind", "run_after").first()


def jobs_stuck(*, now: datetime) -> QuerySet[Job]:
    """Rows in `processing` whose lease expired: their worker stopped heartbeating (I4), so
    the reaper reclaims them. Served by the partial index jobs_job_lease_idx."""
    return Job.objects.filter(status=Job.Status.PROCESSING, lease_expires_at__lt=now)


def jobs_finished_per_bucket(*, since: datetime, step: timedelta) -> dict[str, dict[datetime, int]]:
    """Jobs completed and failed for good per bucket of width `step` since `since` (bucket
    starts counted from the epoch in UTC: project.pg_time.DateBin); one query.

    A retried attempt is not a failure here: only rows that reached `failed` (failed_at) count.
    Completed rows older than JOBS_RETENTION_DAYS are pruned, which never reaches the 7-day
    window of the health page's longest range at the default retention (14 days).
    """
    finished = Q(status=Job.Status.COMPLETED, completed_at__gte=since) | Q(
        status=Job.Status.FAILED, failed_at__gte=since
    )
    ended = Case(When(status=Job.Status.COMPLETED, then=F("completed_at")), default=F("failed_at"))
    rows = (
        Job.objects.filter(finished)
        .annotate(bucket=DateBin(step, ended))
        .values("status", "bucket")
        .annotate(n=Count("*"))
        .order_by("status", "bucket")
    )
    series: dict[str, dict[datetime, int]] = {Job.Status.COMPLETED: {}, Job.Status.FAILED: {}}
    for row in rows:
        series[row["status"]][row["bucket"]] = row["n"]
    return series


def job_attempt_completed_by(*, job_id: int, number: int, worker: str) -> bool:
    """Whether attempt `number` of job `job_id`, run by `worker`, ended completed: how the
    runner tells, after a completion's answer was lost and the resent completion found the
    row no longer processing, that its first completion had committed (issue 29)."""
    return JobAttempt.objects.filter(
        job_id=job_id, number=number, worker=worker[:200], outcome=JobAttempt.Outcome.COMPLETED
    ).exists()


# One round trip for a lingering drain: is a job due (`jobs_first_due_v1`, migration 0017,
# as the wake-up listener's own check in jobs/due_check_sql.py and the claim read it: a range of
# jobs_job_lane_idx per lane that may run, at or above the caller's floor, issue 32 point
# 1), and is a django-q2 task waiting in the ORM broker for a worker (a row whose lock has
# passed: queued, or its retry is due).
_LINGER_SQL = """
SELECT EXISTS (SELECT 1 FROM django_q_ormq WHERE lock <= %s), clock_timestamp(),
    jobs_first_due_v1(coalesce(%s::timestamptz, '-infinity'), statement_timestamp())
"""


@dataclass(frozen=True)
class LingerPoll:
    """What a lingering drain's poll saw."""

    scanned_at: datetime  # the database's clock
    due_run_after: datetime | None  # the first due job's `run_after` (None: none due)
    task_waiting: bool  # a django-q2 task waits in the broker for a worker


def job_due_or_task_waiting(*, now: datetime, floor: datetime | None = None) -> LingerPoll:
    """Whether a job due now (on the database's clock; `run_after` at or above `floor`, see
    jobs/claim_floor.py) waits, and whether a django-q2 task waits in the broker for a
    worker (by `now`, this host's clock, as django-q2's broker itself decides): what a
    lingering drain asks every JOBS_LINGER_POLL_SECONDS. One read of the broker's index and
    one range of jobs_job_lane_idx per lane that may run (as the claim reads them, so a
    paused kind's backlog is not read; issue 36, point 1), no write and no trigger. The
    `run_after` it gives is the earliest due, which is what a floor may rise to."""
    with connection.cursor() as cursor:
        cursor.execute(_LINGER_SQL, [now, floor])
        waiting, scanned_at, due_run_after = cursor.fetchone()
    return LingerPoll(scanned_at, due_run_after, bool(waiting))


def job_next_due_within(seconds: float) -> float:
    """Seconds until the first job that becomes due within `seconds` from now (a job queued
    to run later, or a rate-limited kind's next token: `jobs_first_due_v1`, migration 0025),
    or `seconds` when none does: how long an idle `run_jobs` process sleeps, so a limited
    kind's next job starts when its token comes, not at the next poll (issue 38, point 3)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM jobs_first_due_v1(statement_timestamp() "
            "+ interval '1 microsecond', statement_timestamp() + make_interval(secs => %s)) "
            "- clock_timestamp())::float8",
            [seconds],
        )
        (due_in,) = cursor.fetchone()
    return seconds if due_in is None else min(seconds, max(0.0, due_in))
