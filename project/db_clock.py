"""The database's clock: the one clock every host agrees on.

Several hosts run workers against one PostgreSQL, and their clocks may differ by minutes.
Every lease, heartbeat, expiry and "older than" comparison therefore uses the database's
time: `now()` / `clock_timestamp()` in the statement itself where it can, and this function
where Python needs the value (a backoff computed from it, a cut-off passed to a query).
Never `timezone.now()` or `time.time()` for anything another host compares.
"""

from __future__ import annotations

from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connections


def db_now(using: str = DEFAULT_DB_ALIAS) -> datetime:
    """The database's current time (`clock_timestamp()`: it moves inside a transaction too)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]
