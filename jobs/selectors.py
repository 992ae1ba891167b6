"""Reads of the Job table that more than one entry point needs (admin, reaper, worker_status,
the health page, /metrics): each rule about what a job's state means lives here once."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.db.models import QuerySet, Subquery, Sum

from jobs.models import Job, JobCount


def job_status_counts() -> dict[str, int]:
    """Rows per status, every status present (zero if none), from the trigger-kept counts
    (jobs.models.JobCount): no scan of the jobs table, whatever its size."""
    counts = dict(JobCount.objects.values_list("status").annotate(total=Sum("n")).order_by())
    return {status: counts.get(status, 0) for status in Job.Status.values}


def job_counts_by_kind() -> dict[str, dict[str, int]]:
    """{kind: {status: rows}} for the statuses a kind has rows in, kinds in name order (from
    the trigger-kept counts)."""
    by_kind: dict[str, dict[str, int]] = {}
    rows = (
        JobCount.objects.values("kind", "status")
        .annotate(total=Sum("n"))
        .filter(total__gt=0)
        .order_by("kind", "status")
    )
    for row in rows:
        by_kind.setdefault(row["kind"], {})[row["status"]] = row["total"]
    return by_kind


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


# count(*), not count(id): the index alone answers. Grouped by date_bin (a timestamp, hashed),
# and only the 1,440 groups turned into whole minutes since 1970: an integer loads for
# nothing, where loading and converting the timestamps (TruncMinute) cost ~50 ms of Python a
# request, and EXTRACT(EPOCH) on every row (numeric) ~20 ms of SQL (bench/console.py).
_PER_MINUTE = """
    SELECT (extract(epoch FROM minute) / 60)::bigint, n FROM (
        SELECT date_bin('1 minute', {column}, timestamptz '2000-01-01 00:00+00') AS minute,
               count(*) AS n
        FROM {table} WHERE status = %s AND {column} >= %s GROUP BY 1
    ) AS per_minute ORDER BY 1
"""


def jobs_finished_per_minute(*, since: datetime) -> dict[str, dict[datetime, int]]:
    """Jobs completed and failed for good per minute since `since` (UTC minute starts).

    A retried attempt is not a failure here: only rows that reached `failed` (failed_at) count.
    Completed rows older than JOBS_RETENTION_DAYS are pruned, which never reaches a 24 h window.
    Each status is read from an index alone: jobs_job_status_done_idx (status, completed_at)
    and the partial jobs_job_failed_at_idx.
    """
    series: dict[str, dict[datetime, int]] = {}
    columns = ((Job.Status.COMPLETED, "completed_at"), (Job.Status.FAILED, "failed_at"))
    with connection.cursor() as cursor:
        for status, column in columns:
            cursor.execute(
                _PER_MINUTE.format(table=Job._meta.db_table, column=column), [status, since]
            )
            series[status] = {
                datetime.fromtimestamp(minute * 60, UTC): n for minute, n in cursor.fetchall()
            }
    return series
