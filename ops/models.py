"""The operations app's tables: what the worker refused to run (issue 19), and the rate and
histogram series /metrics exports (issue 20).

Why a table for the metric series: a job completes in a qcluster worker process, mail is
handled in another, and /metrics is served by the web; prometheus-client's in-process
Counter/Histogram objects would each count only their own process (and reset on every django-q2
worker recycle). The events are database writes anyway, so triggers (migration 0002) count them
in the same transaction as the write: a rolled-back job is not counted, a producer that
bypasses our code is.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone


class RefusedTask(models.Model):
    """One django-q2 task that named a function outside the allowlist (ops/task_guard.py).

    Written by the process that refused it (the enqueuing one, or the cluster's pusher for a
    row that reached the broker some other way); read by worker_status, the health page and
    /metrics. Deleting a row is how an operator acknowledges it.
    """

    class Source(models.TextChoices):
        ENQUEUE = "enqueue", "enqueue (a schedule, the admin, code)"
        BROKER = "broker", "broker row (written past django-q2)"

    refused_at = models.DateTimeField(default=timezone.now, db_index=True)
    source = models.CharField(max_length=20, choices=Source.choices)
    func = models.TextField(help_text="the function the task named (never imported)")
    hook = models.TextField(blank=True)
    task_name = models.CharField(max_length=200, blank=True)
    group = models.CharField(
        max_length=200, blank=True, help_text="for a scheduled task: the schedule's name"
    )
    reason = models.TextField()

    class Meta:
        ordering = ["-refused_at", "-id"]

    def __str__(self) -> str:
        return f"refused {self.func} ({self.source})"


class MetricSeries(models.Model):
    """One shard of one labelled series: a counter (`count`) or a histogram (`count`, `sum`,
    non-cumulative `buckets` over the upper bounds `bounds`, the last bucket being +Inf).

    Rows are only ever incremented (never decremented, never pruned), so every exported
    counter is monotonic. `shard` is the writing backend's pid modulo 16, so workers
    completing jobs of one kind at once do not queue on one row lock.
    """

    metric = models.CharField(max_length=64)
    label = models.CharField(max_length=100)
    shard = models.SmallIntegerField()
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0)
    bounds = ArrayField(models.FloatField(), default=list)
    buckets = ArrayField(models.BigIntegerField(), default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["metric", "label", "shard"], name="ops_metricseries_metric_label_shard"
            )
        ]

    def __str__(self) -> str:
        return f"{self.metric}{{{self.label}}}#{self.shard}={self.count}"


class JobPeriod(models.Model):
    """One shard of one job kind's figures for one 30-minute UTC period: attempts completed,
    failed for good and retried (ended in that period), the histogram of their durations,
    and the histogram of the queue waits of attempts started in it (start minus due time).

    Kept by the statement trigger of migration 0004 (0003's row trigger before it) in the
    transaction that records each start and each end of an attempt, like MetricSeries;
    unlike it, windowed, so the health page reads its 24 h per-kind table and its 24 h and
    7 d jobs charts from at most periods × kinds × 8 rows through the (start, kind, shard)
    index, whatever the size of the jobs table (issue 20).
    Bucket bounds are ops.job_periods.DURATION_BOUNDS and WAIT_BOUNDS (changing them needs a
    new table). Rows older than JOB_PERIODS_KEPT are pruned hourly. `shard` is the writing
    backend's pid modulo 8 (fewer row-lock queues between workers).
    """

    start = models.DateTimeField()
    kind = models.CharField(max_length=100)
    shard = models.SmallIntegerField()
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    durations = ArrayField(models.BigIntegerField(), default=list)
    waits = ArrayField(models.BigIntegerField(), default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["start", "kind", "shard"], name="ops_jobperiod_start_kind_shard"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.start:%Y-%m-%d %H:%M} #{self.shard}"


class MetricDelta(models.Model):
    """One statement's (or one row trigger's) observations of one series and bucket,
    appended by migration 0005's triggers (issue 32). Append-only, so no job, mail or
    notification updates a row another one writes; `ops_series_rollup()` (every few seconds,
    ops.rollups) moves the rows into MetricSeries, and ops.rates sums both."""

    metric = models.CharField(max_length=64)
    label = models.CharField(max_length=100)
    count = models.BigIntegerField()
    sum = models.FloatField(default=0)
    bounds = ArrayField(models.FloatField(), default=list)
    buckets = ArrayField(models.BigIntegerField(), default=list)

    def __str__(self) -> str:
        return f"{self.metric}{{{self.label}}} +{self.count}"


class JobPeriodDelta(models.Model):
    """One statement's attempts of one kind in one 30-minute period (JobPeriod's columns,
    no shard), appended by migration 0005's statement trigger (issue 32) and moved into
    JobPeriod by `ops_series_rollup()` every few seconds; ops.job_periods sums both."""

    start = models.DateTimeField()
    kind = models.CharField(max_length=100)
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    durations = ArrayField(models.BigIntegerField(), default=list)
    waits = ArrayField(models.BigIntegerField(), default=list)

    def __str__(self) -> str:
        return f"{self.kind} {self.start:%Y-%m-%d %H:%M} (pending)"
