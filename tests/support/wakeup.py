"""A producer and a listener that bypass Django: what the web app and the Slack bot do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
def listening() -> Iterator[Callable[..., list[str]]]:
    """A LISTEN connection; yields `received(wait=None)`, the notifications received since.

    `received(seconds)` returns what arrives within that window: to show that none comes.
    `received()` waits up to 10 s for the first notification, then 0.3 s for any more, so a
    notification expected at once is not missed because a loaded server delivered it late
    (delivery to a listener is asynchronous), and one too many still shows.
    """
    conn = raw_connection()
    conn.execute(f"LISTEN {CHANNEL}")

    def received(wait: float | None = None) -> list[str]:
        if wait is not None:
            return [n.channel for n in conn.notifies(timeout=wait)]
        first = [n.channel for n in conn.notifies(timeout=10, stop_after=1)]
        return first + [n.channel for n in conn.notifies(timeout=0.3)]

    try:
        yield received
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
