"""Reads of the Job table that more than one entry point needs."""

from __future__ import annotations

from django.db.models import Count

from jobs.models import Job


def job_status_counts() -> dict[str, int]:
    """Rows per status, every status present (zero if none): one GROUP BY."""
    counts = dict(Job.objects.values_list("status").annotate(n=Count("id")).order_by())
    return {status: counts.get(status, 0) for status in Job.Status.values}
