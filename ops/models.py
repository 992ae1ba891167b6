"""The rate and histogram series /metrics exports, kept by database triggers.

Why a table: a job completes in a qcluster worker process, mail is handled in another, and
/metrics is served by the web; prometheus-client's in-process Counter/Histogram objects would
each count only their own process (and reset on every django-q2 worker recycle). The events
are database writes anyway, so triggers (migration 0001) count them in the same transaction
as the write: a rolled-back job is not counted, a producer that bypasses our code is.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models


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
