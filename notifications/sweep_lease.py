"""One cycle of a sweep at a time across every worker on every host: a lease row per sweep
kind (`SweepLease`), judged on the database's clock.

django-q2 enqueues a schedule again when its interval passes even if the last run still
goes, so two cycles of one sweep would otherwise overlap (safe, but each duplicate insert
logs an error). This used to be a session-level advisory lock, which transaction pooling
(PgBouncer) breaks: the lock is taken on one server connection, every client served by that
connection then "holds" it too, and the unlock may run on another one, leaving it held.

Each statement here is one transaction of its own, so it works through any pooler:

- acquire: one upsert that takes the row only when its lease has expired;
- renew: the holder pushes `expires_at` on while its cycle runs (a thread, `LeaseKeeper`,
  every quarter of the lease, on a connection of its own), and learns if it lost the lease;
- release: the holder deletes its row when the cycle ends. A holder that died stops
  renewing, and the next cycle runs once its lease has expired.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime

from django.db import connection

from notifications.models import SweepLease
from project.reconnect import connection_lost, discard_broken_connection

logger = logging.getLogger(__name__)

TABLE = SweepLease._meta.db_table
HOLDER_MAX = SweepLease._meta.get_field("holder").max_length


def new_holder() -> str:
    """This cycle's name in the lease row: host, pid and a token of its own."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"[:HOLDER_MAX]


def sweep_lease_acquire(*, kind: str, holder: str, seconds: float) -> datetime | None:
    """Take the lease of sweep `kind` unless another holder's is still live; return the
    database's time when taken (the cycle's clock), None when another holder has it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} AS lease (kind, holder, acquired_at, expires_at) "
            "VALUES (%s, %s, clock_timestamp(), clock_timestamp() + make_interval(secs => %s)) "
            "ON CONFLICT (kind) DO UPDATE SET holder = EXCLUDED.holder, "
            "acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at "
            "WHERE lease.expires_at <= clock_timestamp() "
            "RETURNING acquired_at",
            [kind, holder, seconds],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def sweep_lease_renew(*, kind: str, holder: str, seconds: float) -> bool:
    """Extend our lease; False when it is no longer ours (it expired and another took it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET expires_at = clock_timestamp() + make_interval(secs => %s) "
            "WHERE kind = %s AND holder = %s",
            [seconds, kind, holder],
        )
        return cursor.rowcount == 1


def sweep_lease_release(*, kind: str, holder: str) -> None:
    """Give the lease back at the end of the cycle: on a fresh connection if the sweep's
    died with the cycle. If the database stays out of reach the lease expires by itself."""
    try:
        _delete(kind, holder)
    except Exception as exc:
        if not connection_lost(exc):
            raise
        discard_broken_connection()
        try:
            _delete(kind, holder)
        except Exception as again:
            if not connection_lost(again):
                raise
            logger.warning(
                "%s sweep: its lease could not be released (%s); it expires by itself",
                kind,
                again,
                extra={"action": "notification_sweep_lease_not_released", "sweep": kind},
            )


def _delete(kind: str, holder: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE kind = %s AND holder = %s", [kind, holder])


class LeaseKeeper(threading.Thread):
    """Renews a sweep's lease every quarter of it while the cycle runs, on this thread's own
    connection (the sweep's may be busy in a long statement or waiting on the mail service).
    `lost` is set when the lease is no longer ours; the sweep then ends its cycle."""

    def __init__(self, *, kind: str, holder: str, seconds: float) -> None:
        super().__init__(name=f"sweep-lease-{kind}", daemon=True)
        self.kind, self.holder, self.seconds = kind, holder, seconds
        self.lost = threading.Event()
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=self.seconds)

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.seconds / 4):
                try:
                    renewed = sweep_lease_renew(
                        kind=self.kind, holder=self.holder, seconds=self.seconds
                    )
                except Exception as exc:  # noqa: BLE001 - the keeper's loop: logged, the next beat tries again on a fresh connection
                    logger.warning(
                        "%s sweep: renewing its lease failed (%s); trying again",
                        self.kind,
                        exc,
                        extra={
                            "action": "notification_sweep_lease_renew_failed",
                            "sweep": self.kind,
                        },
                    )
                    connection.close()
                    continue
                if not renewed:
                    logger.warning(
                        "%s sweep: its lease expired and another worker took it; this cycle "
                        "ends after its batch",
                        self.kind,
                        extra={"action": "notification_sweep_lease_lost", "sweep": self.kind},
                    )
                    self.lost.set()
                    return
        finally:
            connection.close()  # this thread's own connection
