"""The health page's per-kind table (issue 20): for each job kind, queued and running now,
and over the page's range (1 h, 24 h or 7 d; issue 31.6): completed, failed for good, p95
duration and p95 queue wait.

Now-counts come from the trigger-kept jobs.models.JobCount (worker_status reads them
already); the range's figures from the trigger-kept ops.models.JobPeriod, one indexed range read
of at most 336 periods (7 d) × kinds × 8 shards rows, whatever the size of the jobs table. The same
rows give the jobs chart's 30-minute and 3-hour bars (`finished_per_bucket`). A p95 is
read from a histogram: the upper bound of the bucket holding the 95th percentile, so
"≤ 2.5 s" says that 95 % of the attempts took at most that long (the same buckets as
/metrics' worker_job_duration_seconds and worker_job_queue_wait_seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import F, QuerySet, Sum

from ops.charts import bucket_floor
from ops.durations import humanize_seconds
from ops.models import JobPeriod, JobPeriodDelta
from project.pg_time import DateBin

# Upper bounds (seconds): those of migration 0004's ops_job_statement() (and of /metrics).
DURATION_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
WAIT_BOUNDS = (0.1, 0.5, 1, 2.5, 5, 15, 60, 300, 900, 3600, 21600)
PERIOD = timedelta(minutes=30)  # the trigger's date_bin (migration 0003)
WINDOW = timedelta(hours=24)
JOB_PERIODS_KEPT = timedelta(days=8)  # the longest range (7 d) and a day
MAX_KINDS = 50  # rows the table shows; kinds come from any producer, so the list is bounded


@dataclass
class KindStats:
    kind: str
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    durations: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BOUNDS) + 1))
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BOUNDS) + 1))

    @property
    def p95_duration(self) -> str:
        return p95_words(self.durations, DURATION_BOUNDS)

    @property
    def p95_wait(self) -> str:
        return p95_words(self.waits, WAIT_BOUNDS)

    @property
    def activity(self) -> int:
        return self.queued + self.running + self.completed + self.failed + self.retried


@dataclass(frozen=True)
class KindTable:
    rows: tuple[KindStats, ...]
    since: datetime  # the start of the first period summed
    more: int = 0  # kinds left out past MAX_KINDS


def p95_bound(counts: Sequence[int], bounds: Sequence[float]) -> float | None:
    """The upper bound of the bucket holding the 95th percentile (math.inf: past the last
    bound), or None without observations. `counts` are per bucket, +Inf last."""
    total = sum(counts)
    if not total:
        return None
    rank = math.ceil(0.95 * total)
    running = 0
    for bound, n in zip((*bounds, math.inf), counts, strict=False):
        running += n
        if running >= rank:
            return bound
    return math.inf  # pragma: no cover - the counts add up to total


def p95_words(counts: Sequence[int], bounds: Sequence[float]) -> str:
    bound = p95_bound(counts, bounds)
    if bound is None:
        return "—"
    if bound == math.inf:
        return f"> {humanize_seconds(bounds[-1])}"
    return f"≤ {humanize_seconds(bound)}"


def _add(into: list[int], values: Sequence[int] | None) -> None:
    # A row written with other bounds (a hand-edited table) would misplace counts: refuse it.
    if values and len(values) != len(into):
        raise ValueError(f"job period histogram has {len(values)} buckets, expected {len(into)}")
    for i, n in enumerate(values or ()):
        into[i] += n


def kind_table(
    *,
    now: datetime,
    counts_by_kind: Mapping[str, Mapping[str, int]],
    window: timedelta = WINDOW,
) -> KindTable:
    """One query: the JobPeriod rows of the current 30-minute period and those before it
    back to `window` (the health page's range: 2 periods for 1 h, 48 for 24 h, 336 for 7 d;
    the current period is partly elapsed, so the table covers the range less a part of one
    period, as the jobs chart does), and the deltas of those periods not rolled up yet
    (issue 32)."""
    if window < PERIOD or window % PERIOD:
        raise ValueError(f"window {window} is not a whole number of {PERIOD} periods")
    since = bucket_floor(now, PERIOD) - (window - PERIOD)
    stats: dict[str, KindStats] = {}
    for kind, counts in counts_by_kind.items():
        row = stats.setdefault(kind, KindStats(kind))
        row.queued = counts.get("queued", 0)
        row.running = counts.get("processing", 0)
    # Rows summed here, not in SQL: an element-wise array sum in PostgreSQL (ops_array_sum)
    # cost 170 ms for a day of periods at 1,000,000 jobs (bench/console.py), this ~20 ms.
    columns = ("kind", "completed", "failed", "retried", "durations", "waits")
    periods = (
        JobPeriod.objects.filter(start__gte=since)
        .order_by()
        .values_list(*columns)
        .union(
            JobPeriodDelta.objects.filter(start__gte=since).order_by().values_list(*columns),
            all=True,
        )
    )
    for kind, completed, failed, retried, durations, waits in periods:
        row = stats.setdefault(kind, KindStats(kind))
        row.completed += completed
        row.failed += failed
        row.retried += retried
        _add(row.durations, durations)
        _add(row.waits, waits)
    active = [row for row in stats.values() if row.activity]
    active.sort(key=lambda row: (-row.activity, row.kind))
    shown = sorted(active[:MAX_KINDS], key=lambda row: row.kind)
    return KindTable(rows=tuple(shown), since=since, more=max(len(active) - MAX_KINDS, 0))


def job_periods_prune(*, now: datetime) -> int:
    """Delete JobPeriod rows (and deltas not rolled up) older than JOB_PERIODS_KEPT."""
    deleted, _ = JobPeriod.objects.filter(start__lt=now - JOB_PERIODS_KEPT).delete()
    JobPeriodDelta.objects.filter(start__lt=now - JOB_PERIODS_KEPT).delete()
    return deleted


def finished_per_bucket(*, since: datetime, step: timedelta) -> dict[str, dict[datetime, int]]:
    """Attempts completed and jobs failed for good per bucket of `step` (a whole multiple of
    PERIOD) since `since`, summed from the periods: the jobs chart's 24 h and 7 d ranges,
    one query of at most 336 periods × kinds × 8 rows instead of a scan of a week of jobs.

    Counted as the attempts end (the trigger), so it keeps counting jobs pruned or deleted
    since; a row written already finished (never claimed) is not counted.
    """
    if step % PERIOD:
        raise ValueError(f"step {step} is not a whole number of {PERIOD} periods")

    def per_bucket(rows: QuerySet) -> QuerySet:
        return (
            rows.filter(start__gte=since)
            .order_by()
            .annotate(bucket=DateBin(step, F("start")))
            .values_list("bucket")
            .annotate(c=Sum("completed"), f=Sum("failed"))
        )

    rows = per_bucket(JobPeriod.objects.all()).union(
        per_bucket(JobPeriodDelta.objects.all()), all=True
    )
    series: dict[str, dict[datetime, int]] = {"completed": {}, "failed": {}}
    for bucket, completed, failed in rows:
        for status, n in (("completed", completed), ("failed", failed)):
            if n:
                series[status][bucket] = series[status].get(bucket, 0) + n
    return {status: dict(sorted(counts.items())) for status, counts in series.items()}
