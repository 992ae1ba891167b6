"""The health page's per-kind table (issue 20): for each job kind, queued and running now,
and over the page's range (1 h, 24 h or 7 d; issue 31.6): completed, failed for good, p95
duration and p95 queue wait.

Now-counts come from the trigger-kept jobs.models.JobCount (worker_status reads them
already); the range's figures from the trigger-kept ops.models.JobPeriod, one indexed range read
of at most 337 periods (7 d) × kinds × 8 shards rows, whatever the size of the jobs table. The same
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

from django.db import connection
from django.db.models import F, QuerySet, Sum

from ops.charts import bucket_floor
from ops.durations import humanize_seconds
from ops.histogram_sql import bucket_sums
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
    covers: timedelta = timedelta(0)  # from `since` to the table's `now`

    @property
    def span(self) -> str:
        """What the table covers, in words ("1 h 11 min"): its label says so (issue 36.8)."""
        return humanize_seconds(self.covers)


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


@dataclass(frozen=True)
class PeriodTotals:
    """One kind's sums over a run of periods (rolled up and deltas alike)."""

    completed: int
    failed: int
    retried: int
    durations: tuple[int, ...]  # non-cumulative, DURATION_BOUNDS then +Inf
    waits: tuple[int, ...]  # non-cumulative, WAIT_BOUNDS then +Inf


# Summed in SQL, one bucket a column: the histograms have a fixed number of buckets, so the
# element-wise sum is plain sum() over subscripts, ~40 ms for the 7 d range at 1,000,000 jobs
# (21,560 periods and a few seconds of deltas). Read into Python, parsing the arrays alone
# took ~90 ms and adding them as much again (bench/console.py); ops_array_sum, a PL/pgSQL
# aggregate, ~2.5 µs a row and array. A row whose arrays have another length (a hand-edited
# table) would misplace counts: `odd` says so and the reader refuses it.
_DURATION_BUCKETS = len(DURATION_BOUNDS) + 1
_WAIT_BUCKETS = len(WAIT_BOUNDS) + 1
_PERIOD_TOTALS_SQL = f"""
WITH bounds AS (SELECT coalesce(%(since)s::timestamptz, now() - %(window)s::interval) AS since)
SELECT kind, coalesce(sum(completed), 0)::bigint, coalesce(sum(failed), 0)::bigint,
    coalesce(sum(retried), 0)::bigint,
    coalesce(bool_or(cardinality(durations) NOT IN (0, {_DURATION_BUCKETS})
                     OR cardinality(waits) NOT IN (0, {_WAIT_BUCKETS})), false),
    {bucket_sums("durations", _DURATION_BUCKETS)},
    {bucket_sums("waits", _WAIT_BUCKETS)}
FROM (
    SELECT kind, completed, failed, retried, durations, waits
    FROM {JobPeriod._meta.db_table} WHERE start >= (SELECT since FROM bounds)
    UNION ALL
    SELECT kind, completed, failed, retried, durations, waits
    FROM {JobPeriodDelta._meta.db_table} WHERE start >= (SELECT since FROM bounds)
) AS periods
GROUP BY kind
"""


def period_totals(
    *, since: datetime | None = None, window: timedelta | None = None
) -> dict[str, PeriodTotals]:
    """{kind: its sums over the periods starting at or after `since` (or `window` before
    the database's clock)}: the rolled-up JobPeriod rows and the deltas not rolled up yet
    (issue 32), in one statement, so a rollup that commits meanwhile is counted once."""
    if (since is None) == (window is None):
        raise ValueError("period_totals takes `since` or `window`")
    with connection.cursor() as cursor:
        cursor.execute(_PERIOD_TOTALS_SQL, {"since": since, "window": window})
        rows = cursor.fetchall()
    totals: dict[str, PeriodTotals] = {}
    for kind, completed, failed, retried, odd, *buckets in rows:
        if odd:
            raise ValueError(
                f"job period histograms of kind {kind!r} do not have {_DURATION_BUCKETS} "
                f"duration and {_WAIT_BUCKETS} wait buckets"
            )
        totals[kind] = PeriodTotals(
            completed,
            failed,
            retried,
            tuple(buckets[:_DURATION_BUCKETS]),
            tuple(buckets[_DURATION_BUCKETS:]),
        )
    return totals


def kind_table(
    *,
    now: datetime,
    counts_by_kind: Mapping[str, Mapping[str, int]],
    window: timedelta = WINDOW,
) -> KindTable:
    """One query (`period_totals`): the JobPeriod rows of every 30-minute period that
    overlaps the last `window` (the health page's range), the current one included, and the
    deltas of those periods not rolled up yet (issue 32).

    The periods are the finest the rows hold, so the table covers the whole range and up to
    one period more: "since 23:00 (1 h 11 min)" at 00:11 for 1 h. It used to start a period
    later, covering up to a period less than the range its label named (issue 36.8); the
    label now gives the start and the span, whichever the range."""
    if window < PERIOD or window % PERIOD:
        raise ValueError(f"window {window} is not a whole number of {PERIOD} periods")
    since = bucket_floor(now - window, PERIOD)
    stats: dict[str, KindStats] = {}
    for kind, counts in counts_by_kind.items():
        row = stats.setdefault(kind, KindStats(kind))
        row.queued = counts.get("queued", 0)
        row.running = counts.get("processing", 0)
    for kind, totals in period_totals(since=since).items():
        row = stats.setdefault(kind, KindStats(kind))
        row.completed += totals.completed
        row.failed += totals.failed
        row.retried += totals.retried
        row.durations = list(totals.durations)
        row.waits = list(totals.waits)
    active = [row for row in stats.values() if row.activity]
    active.sort(key=lambda row: (-row.activity, row.kind))
    shown = sorted(active[:MAX_KINDS], key=lambda row: row.kind)
    return KindTable(
        rows=tuple(shown), since=since, more=max(len(active) - MAX_KINDS, 0), covers=now - since
    )


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
