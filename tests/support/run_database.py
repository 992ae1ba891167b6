"""scripts/test's database of its own per run: the URL's name plus `_r<pid>`, and its drop.

pytest-django creates and drops `test_<name>` (under pytest-xdist one per worker,
`test_<name>_gw0`, `test_<name>_gw1`, ...); a run killed before its teardown leaves them
behind, so scripts/test drops them again on exit. Two runs in parallel thus never share (or
destroy) each other's test databases, whatever TEST_DATABASE_URL they were given.

    python -m tests.support.run_database name URL PID   # print URL with the run's name
    python -m tests.support.run_database drop URL       # drop test_<name> and its workers'
"""

from __future__ import annotations

import re
import sys
from urllib.parse import unquote, urlsplit, urlunsplit

MAX_NAME = 63 - len("test_")  # PostgreSQL's identifier limit, with pytest-django's prefix


def run_url(url: str, pid: str) -> str:
    """`url` with its database name made unique to this run."""
    parts = urlsplit(url)
    base = unquote(parts.path.lstrip("/")) or "worker"
    suffix = f"_r{pid}"
    name = base[: MAX_NAME - len(suffix)] + suffix
    return urlunsplit(parts._replace(path="/" + name))


def run_databases(name: str, existing: list[str]) -> list[str]:
    """Which of the `existing` database names belong to the run whose URL names `name`:
    pytest-django's test_<name>, each xdist worker's test_<name>_gw<N>, and the `_deploy`
    database a rolling-deploy test makes beside either. Exact matches only: run _r12's
    names are not run _r123's."""
    own = re.compile(rf"test_{re.escape(name)}(_gw[0-9]+)?(_deploy)?")
    return [database for database in existing if own.fullmatch(database)]


def drop_test_database(url: str) -> None:
    """Drop this run's test databases (FORCE: a killed run's sessions)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = unquote(parts.path.lstrip("/"))
    admin = urlunsplit(parts._replace(path="/postgres", scheme="postgresql"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        existing = [row[0] for row in conn.execute("SELECT datname FROM pg_database")]
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        for database in run_databases(name, existing):
            conn.execute(drop.format(sql.Identifier(database)))


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[1] == "name":
        print(run_url(argv[2], argv[3]))
        return 0
    if len(argv) == 3 and argv[1] == "drop":
        drop_test_database(argv[2])
        return 0
    print("usage: python -m tests.support.run_database name URL PID | drop URL", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
