"""Reads of the ops app's own rows, and of the database's own state (pg_stat_activity)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import QuerySet

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
