"""The SQL of writer-slot leases, run on a connection of its own.

A lease must never roll back with the caller's transaction (a record_message inside a job's
`atomic()` that later fails would otherwise leave this process minting in a slot the
database calls free), and django-q2 closes Django's connections before each task. So every
lease operation opens a short-lived connection, runs its statements as one short
transaction of their own, and closes it. Correctness comes from the database: the pool claim is one
`UPDATE ... WHERE slot = (SELECT ... FOR UPDATE SKIP LOCKED)` judged by the database clock.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from canonical_ids.exceptions import SlotUnavailable
from canonical_ids.models import WriterSlotLease
from project import db_pool

logger = logging.getLogger(__name__)

LEASE_ALIAS = "canonical_ids_lease"
LOCK_TIMEOUT_MS = 5000  # a lease statement never waits longer than this on a row lock
# ...nor runs longer than this in all (issue 19.10): a hung server or a stuck statement
# fails the lease call, which the renewal then retries, instead of holding the thread.
STATEMENT_TIMEOUT_MS = 10000
TABLE = WriterSlotLease._meta.db_table


@dataclass(frozen=True)
class Holder:
    """Identity of the claiming process, shown in the admin."""

    role: str
    host: str
    pid: int
    started_at: datetime

    @classmethod
    def current(cls, role: str, started_at: datetime) -> Holder:
        return cls(
            role=role, host=socket.gethostname()[:255], pid=os.getpid(), started_at=started_at
        )


@dataclass(frozen=True)
class Lease:
    slot: int
    token: str
    last_ts: str  # the last id the slot issued under any holder ("" if none)


def database_key() -> tuple:
    """Which database the default connection points at now (tests swap it for test_<name>)."""
    params = connections[DEFAULT_DB_ALIAS].settings_dict
    return (params.get("ENGINE"), params.get("NAME"), params.get("HOST"), params.get("PORT"))


@contextmanager
def lease_connection() -> Iterator[BaseDatabaseWrapper]:
    """A fresh connection to the default database, whose statements form one transaction
    (committed when the block ends, rolled back if it raises), closed afterwards.

    The timeouts are `SET LOCAL`: they end with the transaction. A session-level `SET` stays
    on the server connection, and behind PgBouncer in transaction pooling the next client of
    that server connection (a sweep, a migration) would inherit it (issue 22)."""
    default = connections[DEFAULT_DB_ALIAS]
    conn = default.__class__(db_pool.unpooled(default.settings_dict), alias=LEASE_ALIAS)
    try:
        conn.ensure_connection()
        conn.set_autocommit(False)
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true), "
                "set_config('statement_timeout', %s, true)",
                [str(LOCK_TIMEOUT_MS), str(STATEMENT_TIMEOUT_MS)],
            )
        yield conn
        conn.commit()
    finally:
        conn.close()


def _ensure_rows(conn: BaseDatabaseWrapper, slots: Sequence[int]) -> None:
    values = ", ".join(["(%s, '', '', '', '')"] * len(slots))
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (slot, role, holder_token, holder_host, last_ts) "
            f"VALUES {values} ON CONFLICT (slot) DO NOTHING",
            list(slots),
        )


def lease_acquire(*, slots: Sequence[int], holder: Holder, ttl: float) -> Lease:
    """Claim the lowest free (never held, released or expired) slot of `slots`.

    Raises SlotUnavailable when every slot is held by a live lease.
    """
    token = uuid.uuid4().hex
    with lease_connection() as conn:
        _ensure_rows(conn, slots)
        placeholders = ", ".join(["%s"] * len(slots))
        sql = (
            f"UPDATE {TABLE} SET role = %s, holder_token = %s, holder_host = %s, "
            f"holder_pid = %s, holder_started_at = %s, acquired_at = now(), "
            f"renewed_at = now(), expires_at = now() + make_interval(secs => %s) "
            f"WHERE slot = (SELECT slot FROM {TABLE} WHERE slot IN ({placeholders}) "
            f"AND (expires_at IS NULL OR expires_at <= now()) ORDER BY slot LIMIT 1 "
            f"FOR UPDATE SKIP LOCKED) "
            f"RETURNING slot, last_ts"
        )
        params = [holder.role, token, holder.host, holder.pid, holder.started_at, ttl, *slots]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        raise SlotUnavailable(
            f"No writer slot free for role {holder.role!r} among {_describe(slots)}: every one "
            "is held by a live lease (a killed holder's slot frees when its lease expires)"
        )
    lease = Lease(slot=int(row[0]), token=token, last_ts=row[1] or "")
    logger.info(
        "Claimed writer slot %s for role %s",
        lease.slot,
        holder.role,
        extra={"action": "slot_acquired", "slot": lease.slot, "role": holder.role},
    )
    return lease


def lease_renew(*, slot: int, token: str, last_ts: str, ttl: float) -> bool:
    """Extend our lease and store the last id issued; False if the lease is no longer ours."""
    with lease_connection() as conn:
        with conn.cursor() as cursor:
            cursor.execute(
                f"UPDATE {TABLE} SET renewed_at = now(), "
                f"expires_at = now() + make_interval(secs => %s), "
                f"last_ts = CASE WHEN last_ts < %s THEN %s ELSE last_ts END "
                f"WHERE slot = %s AND holder_token = %s",
                [ttl, last_ts, last_ts, slot, token],
            )
            return cursor.rowcount == 1


def lease_release(*, slot: int, token: str, last_ts: str) -> bool:
    """Give the slot back at once (clean exit), keeping its last id for the next holder."""
    with lease_connection() as conn:
        with conn.cursor() as cursor:
            cursor.execute(
                f"UPDATE {TABLE} SET renewed_at = now(), expires_at = NULL, "
                f"holder_token = '', "
                f"last_ts = CASE WHEN last_ts < %s THEN %s ELSE last_ts END "
                f"WHERE slot = %s AND holder_token = %s",
                [last_ts, last_ts, slot, token],
            )
            released = cursor.rowcount == 1
    if released:
        logger.info(
            "Released writer slot %s", slot, extra={"action": "slot_released", "slot": slot}
        )
    return released


def lease_is_held(*, slot: int, token: str) -> bool:
    """Whether the lease row still names us, read on the caller's (default) connection."""
    return WriterSlotLease.objects.filter(slot=slot, holder_token=token).exists()


def _describe(slots: Sequence[int]) -> str:
    return str(list(slots)) if len(slots) <= 6 else f"{len(slots)} pool slots"
