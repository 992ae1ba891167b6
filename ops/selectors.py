"""Reads of the ops app's own rows, and of the database's own state (pg_stat_activity)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import QuerySet

from ops.job_periods import DURATION_BOUNDS, period_totals
from ops.models import RefusedTask


def tasks_refused() -> QuerySet[RefusedTask]:
    """Refused tasks no operator has acknowledged yet (acknowledging deletes the row)."""
    return RefusedTask.objects.all()


# The oldest transaction another client session keeps open on this database, and whether it
# holds a snapshot (backend_xmin): while it does, PostgreSQL removes no dead row version.
# Only client backends (autovacuum's own transactions hold nothing back); this session's own
# transaction is left out. Without pg_read_all_stats, another role's client address and
# query read as NULL: the application name and the start times still show.
_OLDEST_TRANSACTION = """
SELECT pid, application_name, host(client_addr), xact_start, query_start, state,
    backend_xmin IS NOT NULL
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT 1
"""


@dataclass(frozen=True)
class OpenTransaction:
    pid: int
    application_name: str
    client_addr: str | None  # None: a Unix socket, or hidden from this role
    xact_start: datetime
    query_start: datetime | None
    state: str | None
    holds_snapshot: bool


def database_clock_and_oldest_transaction() -> tuple[str, datetime, OpenTransaction | None]:
    """The server's version, its clock, and the session whose transaction has been open
    longest on this database (pg_stat_activity; None when no other session is inside a
    transaction), read by one statement: worker_status and the health page read the clock
    anyway, so the oldest transaction costs them no round trip."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('server_version'), clock_timestamp(), o.* "
            f"FROM (SELECT) AS one LEFT JOIN ({_OLDEST_TRANSACTION}) AS o ON true"
        )
        version, clock, *oldest = cursor.fetchone()
    return version, clock, OpenTransaction(*oldest) if oldest[0] is not None else None


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
    # Rolled up and not yet rolled up (issue 32: the trigger appends JobPeriodDelta rows,
    # folded into JobPeriod every few seconds): a kind that ran long a moment ago counts.
    # Summed in SQL (period_totals): each worker reads this every SLOW_KINDS_READ_SECONDS.
    slow = []
    for kind, totals in period_totals(window=window).items():
        if sum(totals.durations[quick_buckets:]) > sum(totals.durations[:quick_buckets]):
            slow.append(kind)
    return sorted(slow)
