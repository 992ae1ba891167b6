"""Jobs that ended at given times, moved there as the runner moves them (queued ->
processing -> completed / failed), so the triggers that count attempts (ops.JobPeriod,
/metrics' series, the attempt history) see them, as they would a live worker's."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import F
from django.utils import timezone

from jobs.models import Job


def finish_jobs(kind: str, ends: Iterable[tuple[datetime, str]]) -> list[Job]:
    """One job of `kind` per (end time, "completed" | "failed"), claimed a second before its
    end (due a second before that); five statements whatever the number of jobs."""
    ends = list(ends)
    rows = Job.objects.bulk_create(
        Job(
            kind=kind,
            max_attempts=1,
            run_after=at - timedelta(seconds=2),
            started_at=at - timedelta(seconds=1),  # what the claim below records
        )
        for at, _ in ends
    )
    Job.objects.filter(pk__in=[row.pk for row in rows]).update(
        status="processing",
        attempts=1,
        locked_by="host:1:test",
        lease_expires_at=timezone.now() + timedelta(minutes=2),
    )
    for outcome, column in (("completed", "completed_at"), ("failed", "failed_at")):
        ids = [row.pk for row, (_, end) in zip(rows, ends, strict=True) if end == outcome]
        Job.objects.filter(pk__in=ids).update(
            status=outcome, **{column: F("started_at") + timedelta(seconds=1)}
        )
    return rows
