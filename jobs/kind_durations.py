"""Which job kinds have lately run long: the read the runner's claim needs (issue 29, point 3),
at home in the jobs app (issue 36.7).

The figures are the per-kind duration histograms that ops keeps: ops owns those tables
(`ops.models.JobPeriod`, rolled up, and `JobPeriodDelta`, not rolled up yet), their writer
(its statement trigger on jobs_job, ops migrations 0004/0005), their rollup and their
retention, and the console reads them for its per-kind table. The runner must not import the
console's app (ops imports jobs, never the reverse; tests/jobs/test_kind_durations.py holds
that), so this module names the two tables through the app registry at call time, reads
only `kind`, `start` and `durations`, and keeps a copy of the bucket bounds ops' trigger
writes (the same test checks the copy against ops.job_periods.DURATION_BOUNDS). Were the
histograms ever to move into jobs, only `_tables` would change.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache

from django.apps import apps
from django.db import connection

# Upper bounds (seconds) of the duration buckets, +Inf after the last: ops' trigger's.
DURATION_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
_BUCKETS = len(DURATION_BOUNDS) + 1


@cache
def _tables() -> tuple[str, str]:
    """ops' rolled-up periods and its deltas not rolled up yet (names, not imports)."""
    return (
        apps.get_model("ops", "JobPeriod")._meta.db_table,
        apps.get_model("ops", "JobPeriodDelta")._meta.db_table,
    )


def _buckets_sum(first: int, last: int) -> str:
    """`durations[first] + … + durations[last]` (1-based, inclusive), a missing one as 0."""
    return " + ".join(f"coalesce(durations[{i}], 0)" for i in range(first, last + 1))


def job_kinds_slower_than(*, seconds: float, window: timedelta = timedelta(hours=1)) -> list[str]:
    """Kinds whose attempts that ended within `window` (on the database's clock) mostly ran
    longer than `seconds`: more than half of them beyond the largest duration bound at or
    below `seconds` (DURATION_BOUNDS; the first bound if none is).

    The runner ends a claimed batch with the first job of such a kind, so nothing waits
    behind it to be given back. Rolled-up periods and deltas not rolled up yet are summed
    together in one statement (a kind that ran long a moment ago counts, and a rollup that
    commits meanwhile is counted once); each worker reads this every SLOW_KINDS_READ_SECONDS.
    A kind with no recent attempt is not slow: the keeper gives back behind it if it is.
    A histogram with another number of buckets (a hand-edited row) would misplace counts:
    it is refused, as ops' readers refuse it.
    """
    quick = max(1, sum(1 for bound in DURATION_BOUNDS if bound <= seconds))
    periods, deltas = _tables()
    sql = f"""
        SELECT kind,
            coalesce(bool_or(cardinality(durations) NOT IN (0, {_BUCKETS})), false),
            coalesce(sum({_buckets_sum(quick + 1, _BUCKETS)}), 0)
                > coalesce(sum({_buckets_sum(1, quick)}), 0)
        FROM (
            SELECT kind, durations FROM {periods} WHERE start >= now() - %(window)s::interval
            UNION ALL
            SELECT kind, durations FROM {deltas} WHERE start >= now() - %(window)s::interval
        ) AS periods
        GROUP BY kind
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"window": window})
        rows = cursor.fetchall()
    slow = []
    for kind, odd, is_slow in rows:
        if odd:
            raise ValueError(
                f"job period histograms of kind {kind!r} do not have {_BUCKETS} duration buckets"
            )
        if is_slow:
            slow.append(kind)
    return sorted(slow)
