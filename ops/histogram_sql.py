"""SQL that sums histogram arrays bucket by bucket, for the readers of the counter series.

The histograms (ops.models.MetricSeries / MetricDelta buckets, JobPeriod / JobPeriodDelta
durations and waits) have a fixed, small number of buckets, so an element-wise sum is plain
`sum(column[i])` per bucket: one pass in PostgreSQL, where reading every row's array into
Python and adding it there cost the console hundreds of milliseconds (issue 32, point 3).
"""

from __future__ import annotations


def bucket_sums(column: str, buckets: int) -> str:
    """`buckets` select-list columns: the sum of `column[i]` over the group, 0 when none."""
    return ", ".join(f"coalesce(sum({column}[{i}]), 0)::bigint" for i in range(1, buckets + 1))
