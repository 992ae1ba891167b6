"""The SQL of the process registry, each statement on a short-lived connection of its own.

A beat must neither roll back with the caller's transaction nor depend on a Django
connection django-q2 closes before each task, and a long-lived socket would be inherited by
a forked child. So, as canonical_ids.leases does, every statement opens a fresh connection
to the default database, runs as one short transaction, and closes it. Every time is the
database's `now()`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import metadata

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from processes.conf import MISSED_BEATS, RETENTION_SECONDS
from processes.models import WorkerProcess
from project import db_pool

logger = logging.getLogger(__name__)

ALIAS = "processes_beacon"
TABLE = WorkerProcess._meta.db_table
STATEMENT_TIMEOUT_MS = 5000  # a beat never waits longer than this
CURRENT_MAX = WorkerProcess._meta.get_field("current").max_length


@cache
def software_version() -> str:
    """The installed version of this project (pyproject's [project].version)."""
    try:
        return metadata.version("proposal-worker")[:64]
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


@contextmanager
def own_connection() -> Iterator[BaseDatabaseWrapper]:
    """A fresh connection whose statements form one transaction, committed at the end.

    The timeout is `SET LOCAL`, so it ends with the transaction: a session-level `SET` would
    stay on the server connection behind PgBouncer in transaction pooling, and its next
    client would inherit it (issue 22)."""
    default = connections[DEFAULT_DB_ALIAS]
    conn = default.__class__(db_pool.unpooled(default.settings_dict), alias=ALIAS)
    try:
        conn.ensure_connection()
        conn.set_autocommit(False)
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [str(STATEMENT_TIMEOUT_MS)]
            )
        yield conn
        conn.commit()
    finally:
        conn.close()


def process_register(*, role: str, interval: float) -> int:
    """Insert this OS process's row (host, pid, version, start on the database clock);
    return its id. Rows gone for longer than the retention are deleted on the way."""
    with own_connection() as conn, conn.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {TABLE} WHERE heartbeat_at < now() - make_interval(secs => %s)",
            [RETENTION_SECONDS],
        )
        cursor.execute(
            f"INSERT INTO {TABLE} (role, host, pid, version, started_at, heartbeat_at, "
            f"interval_seconds, gone_after, current) VALUES (%s, %s, %s, %s, now(), now(), %s, "
            f"now() + make_interval(secs => %s), '') RETURNING id",
            [
                WorkerProcess.Role(role).value,
                socket.gethostname()[:255],
                os.getpid(),
                software_version(),
                interval,
                interval * MISSED_BEATS,
            ],
        )
        process_id = int(cursor.fetchone()[0])
    logger.info(
        "process registered: %s #%s",
        role,
        process_id,
        extra={"action": "process_registered", "role": role, "process_id": process_id},
    )
    return process_id


def process_beat(*, process_id: int, current: str, slots: dict | None = None) -> bool:
    """Renew the heartbeat and record what the process works on now (and a job worker's
    slots: total and in use per kind); False when the row is gone (deleted by hand) or
    marked stopped: the caller registers again."""
    with own_connection() as conn, conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET heartbeat_at = now(), "
            f"gone_after = now() + make_interval(secs => interval_seconds * %s), current = %s, "
            f"slots = %s::jsonb WHERE id = %s AND stopped_at IS NULL",
            [
                MISSED_BEATS,
                current[:CURRENT_MAX],
                None if slots is None else json.dumps(slots),
                process_id,
            ],
        )
        return cursor.rowcount == 1


def process_stop(*, process_id: int) -> None:
    """A clean stop: the process is listed as stopped at once, not gone after 3 beats."""
    with own_connection() as conn, conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET heartbeat_at = now(), stopped_at = now(), current = '' "
            f"WHERE id = %s AND stopped_at IS NULL",
            [process_id],
        )
    logger.info(
        "process stopped: #%s",
        process_id,
        extra={"action": "process_stopped", "process_id": process_id},
    )
