"""Rates and histograms for /metrics, read from the trigger-kept series (ops.models).

Exposed with prometheus-client's own metric types (CounterMetricFamily,
HistogramMetricFamily) from a custom collector: the counting happens in the database, in the
transaction of each event, whichever process wrote it; the web that serves /metrics only
sums the shards. Labels are bounded: a job kind not registered in code (another producer's
typo, a hostile row) is folded into `other`, as is any unexpected notification kind or mail
outcome.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.db import connection
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from inbound_email.models import InboundEmail, Reply
from jobs import registry
from notifications.models import EmailNotification
from ops.histogram_sql import bucket_sums
from ops.models import MetricDelta, MetricSeries

OTHER = "other"


@dataclass
class Series:
    count: int = 0
    sum: float = 0.0
    bounds: tuple[float, ...] = ()
    buckets: list[int] = field(default_factory=list)  # non-cumulative, +Inf last

    def add(self, row: dict) -> None:
        bounds = tuple(row["bounds"] or ())
        if self.count and bounds != self.bounds:
            raise ValueError(f"histogram bounds differ between shards: {bounds} vs {self.bounds}")
        self.bounds = bounds
        self.count += row["count"]
        self.sum += row["sum"]
        if bounds:
            if not self.buckets:
                self.buckets = [0] * (len(bounds) + 1)
            for i, n in enumerate(row["buckets"] or ()):
                self.buckets[i] += n

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.buckets, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else f"{bound:g}", running))
        return out


def _bounded(allowed: set[str]) -> Callable[[str], str]:
    return lambda value: value if value in allowed else OTHER


# Summed in SQL, one bucket a column (the histograms have at most MAX_BUCKETS buckets): a few
# seconds of deltas at 1,000 jobs/s are thousands of rows, and reading each into Python
# to add its buckets there cost /metrics 700 ms for a minute of them (bench/console.py).
# A row whose buckets do not match its bounds (a hand-edited table) is refused (`odd`).
MAX_BUCKETS = 32
_SERIES_SQL = f"""
SELECT metric, label, sum(count)::bigint, sum(sum)::float8, bounds,
    coalesce(bool_or(cardinality(buckets) > {MAX_BUCKETS} OR (cardinality(bounds) > 0
        AND cardinality(buckets) NOT IN (0, cardinality(bounds) + 1))), false),
    {bucket_sums("buckets", MAX_BUCKETS)}
FROM (
    SELECT metric, label, count, sum, bounds, buckets FROM {MetricSeries._meta.db_table}
    UNION ALL
    SELECT metric, label, count, sum, bounds, buckets FROM {MetricDelta._meta.db_table}
) AS series
GROUP BY metric, label, bounds
"""


def read_series() -> dict[str, dict[str, Series]]:
    """metric -> bounded label -> the shards and the deltas not rolled up yet (issue 32)
    summed; one statement, so a rollup committing meanwhile is counted once."""
    job_kind = _bounded(set(registry.registered_kinds()))
    bounders: dict[str, Callable[[str], str]] = defaultdict(lambda: job_kind)
    bounders["inbound_mail"] = _bounded(set(InboundEmail.Status.values))
    bounders["notifications_sent"] = _bounded(set(EmailNotification.Kind.values))
    bounders["notifications_failed"] = bounders["notifications_sent"]
    bounders["instruction_relays"] = _bounded(set(Reply.RelayStatus.values))
    found: dict[str, dict[str, Series]] = defaultdict(lambda: defaultdict(Series))
    with connection.cursor() as cursor:
        cursor.execute(_SERIES_SQL)
        rows = cursor.fetchall()
    for metric, label, count, total, bounds, odd, *buckets in rows:
        if odd:
            raise ValueError(
                f"series {metric}/{label}: a row's buckets do not match its {len(bounds)} bounds"
            )
        row = {
            "count": count,
            "sum": total,
            "bounds": bounds,
            "buckets": buckets[: len(bounds) + 1] if bounds else [],
        }
        found[metric][bounders[metric](label)].add(row)
    return found


COUNTERS = (
    ("jobs_completed", "worker_jobs_completed", "Job attempts that completed.", "kind"),
    (
        "job_attempts_failed",
        "worker_job_attempts_failed",
        "Job attempts that failed (retried, failed for good, or reaped).",
        "kind",
    ),
    ("jobs_failed", "worker_jobs_failed", "Jobs that failed for good.", "kind"),
    ("inbound_mail", "worker_inbound_mail", "Inbound mail handled, by outcome.", "outcome"),
    ("notifications_sent", "worker_notifications_sent", "Notifications SES accepted.", "kind"),
    (
        "notifications_failed",
        "worker_notifications_failed",
        "Notifications failed for good.",
        "kind",
    ),
    (
        "instruction_relays",
        "worker_instruction_relays",
        "PI instructions relayed: posted to Slack, or inboxed when Slack never took them.",
        "outcome",
    ),
)
HISTOGRAMS = (
    (
        "job_duration_seconds",
        "worker_job_duration_seconds",
        "Time from an attempt's start to its end (completed, failed or reaped).",
    ),
    (
        "job_queue_wait_seconds",
        "worker_job_queue_wait_seconds",
        "Time from a job being due (run_after) to its attempt starting.",
    ),
)


def rate_metrics() -> Iterator[Metric]:
    series = read_series()
    for key, name, doc, label in COUNTERS:
        family = CounterMetricFamily(name, doc, labels=[label])
        for value, s in sorted(series.get(key, {}).items()):
            family.add_metric([value], s.count)
        yield family
    for key, name, doc in HISTOGRAMS:
        family = HistogramMetricFamily(name, doc, labels=["kind"])
        for kind, s in sorted(series.get(key, {}).items()):
            family.add_metric([kind], s.cumulative(), sum_value=s.sum)
        yield family
