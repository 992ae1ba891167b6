"""Reads of the ops app's own rows."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from django.db.models.functions import Now

from ops.job_periods import DURATION_BOUNDS
from ops.models import JobPeriod, RefusedTask


def tasks_refused() -> QuerySet[RefusedTask]:
    """Refused tasks no operator has acknowledged yet (acknowledging deletes the row)."""
    return RefusedTask.objects.all()


def job_kinds_slower_than(*, seconds: float, window: timedelta = timedelta(hours=1)) -> list[str]:
    """Kinds whose attempts that ended within `window` (on the database's clock) mostly ran
    longer than `seconds`: more than half of them beyond the largest duration bound at or
    below `seconds` (ops.job_periods.DURATION_BOUNDS; the first bound if none is).

    The runner ends a claimed batch with the first job of such a kind (issue 29, point 3),
    so nothing waits behind it to be given back. The figures are the per-kind duration
    histograms of JobPeriod today; this is the one place that reads them for that, so the
    source can change (issue 32 makes those writes append-only) without touching the runner.
    A kind with no recent attempt is not slow: the keeper gives back behind it if it is.
    """
    quick_buckets = max(1, sum(1 for bound in DURATION_BOUNDS if bound <= seconds))
    totals: dict[str, list[int]] = {}
    rows = JobPeriod.objects.filter(start__gte=Now() - window).values_list("kind", "durations")
    for kind, durations in rows:
        counts = totals.setdefault(kind, [0, 0])
        counts[0] += sum(durations[:quick_buckets])
        counts[1] += sum(durations[quick_buckets:])
    return sorted(kind for kind, (quick, slow) in totals.items() if slow > quick)
