"""scripts/test's database of its own per run: the URL's name plus `_r<pid>`, and its drop.

pytest-django creates and drops `test_<name>`; a run killed before its teardown leaves it
behind, so scripts/test drops it again on exit. Two runs in parallel thus never share (or
destroy) each other's test database, whatever TEST_DATABASE_URL they were given.

    python -m tests.support.run_database name URL PID   # print URL with the run's name
    python -m tests.support.run_database drop URL       # drop test_<name> if it exists
"""

from __future__ import annotations

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


def drop_test_database(url: str) -> None:
    """Drop pytest-django's test_<name> of this run (FORCE: a killed run's sessions)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = "test_" + unquote(parts.path.lstrip("/"))
    admin = urlunsplit(parts._replace(path="/postgres", scheme="postgresql"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))


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
