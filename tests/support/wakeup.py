"""A producer and a listener that bypass Django: what the web app and the Slack bot do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection

from jobs.wakeup import CHANNEL


def raw_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


@contextmanager
def listening() -> Iterator:
    """A LISTEN connection; yields a function returning the notifications received since."""
    conn = raw_connection()
    conn.execute(f"LISTEN {CHANNEL}")
    try:
        yield lambda wait=0.5: [n.channel for n in conn.notifies(timeout=wait)]
    finally:
        conn.close()


_PLAIN_INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
VALUES (%s, %s, 'queued', 0, 0, 3, now() + %s::interval, now(), '', '')
RETURNING id
"""


def plain_insert(kind: str, payload: str = "{}", delay: str = "0 seconds") -> int:
    """What the web app or the Slack bot does: SQL on their own connection, no Django."""
    with raw_connection() as conn:
        return conn.execute(_PLAIN_INSERT, [kind, payload, delay]).fetchone()[0]
