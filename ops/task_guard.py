"""What django-q2 may execute: the functions named in code, nothing else (issue 19).

django-q2 runs whatever dotted path a task names: its worker resolves the string with
`pydoc.locate` (importing the module) and calls it, and its monitor does the same with a
task's `hook`. A task comes from a Schedule row (the scheduler, every 30 s), from
`async_task` (our wake-up, the admin's Resubmit) or straight from a row in the broker table,
and each of those can be written by someone other than this code: a staff user in the admin,
another database role, plain SQL. So the worker checks every task against `ALLOWED_FUNCTIONS`
(the functions of `ops.schedules.SCHEDULES` and the job wake-up) before anything it names is
imported, at the two points every task passes:

- `pre_enqueue` (every `async_task`, in every process, `Q_SYNC` too): a refused task is
  recorded, logged at ERROR and rewritten into `refused_task`, which only raises, so django-q2
  stores a failure and nothing the task named is imported or run.
- `GuardedOrmBroker.dequeue` (the cluster's pusher, before a worker sees the task): a row
  naming anything else, or not signed with this deployment's SECRET_KEY, is recorded, logged
  at ERROR and deleted. This catches rows that never went through `async_task`.

Every refusal is a `RefusedTask` row: worker_status, the Worker health page and /metrics
show them until an operator deletes them in the admin.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import BadSignature, SignedPackage

from jobs import pusher_signal
from jobs.wake_tasks import WAKE_TASK
from ops.models import RefusedTask
from ops.schedules import SCHEDULES
from project.reconnect import Reconnect, connection_lost

logger = logging.getLogger(__name__)

REFUSED_TASK = "ops.task_guard.refused_task"
# Every function django-q2 may run. A new schedule or task is added in code, here or in
# ops.schedules.SCHEDULES; nothing in the database can extend this set.
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    {spec.func for spec in SCHEDULES} | {WAKE_TASK, REFUSED_TASK}
)
FIELD_LIMIT = 500  # characters of a refused task's func/hook kept in the record


class TaskRefused(Exception):
    """A task named a function outside ALLOWED_FUNCTIONS (raised by `refused_task`)."""


def describe(value: Any) -> str:
    """What a task's func/hook names, as text, without importing or calling anything."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value[:FIELD_LIMIT]
    name = f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    return f"<{type(value).__name__} {name}>"[:FIELD_LIMIT]


def refusal_reason(task: Mapping[str, Any]) -> str | None:
    """Why the worker must not run `task` (a django-q2 task dict), or None when it may."""
    func = task.get("func")
    if not isinstance(func, str):
        return f"func is a {type(func).__name__}, not the dotted name of an allowed function"
    if func not in ALLOWED_FUNCTIONS:
        return f"{describe(func)!r} is not a function the worker runs (ops.task_guard)"
    if task.get("hook"):
        return f"hook {describe(task.get('hook'))!r}: no task of the worker has a hook"
    return None


def record_refusal(
    *, func: str, hook: str, task_name: str, group: str, reason: str, source: str
) -> RefusedTask:
    logger.error(
        "task refused (%s): %s: %s",
        source,
        func or "?",
        reason,
        extra={"action": "task_refused", "source": source, "func": func, "task_name": task_name},
    )
    return RefusedTask.objects.create(
        source=source,
        func=func,
        hook=hook,
        task_name=task_name[:200],
        group=group[:200],
        reason=reason,
    )


def _record_task(task: Mapping[str, Any], *, reason: str, source: str) -> RefusedTask:
    return record_refusal(
        func=describe(task.get("func")),
        hook=describe(task.get("hook")),
        task_name=describe(task.get("name")),
        group=describe(task.get("group")),
        reason=reason,
        source=source,
    )


def refuse_on_enqueue(sender: Any, task: dict[str, Any], **kwargs: Any) -> None:
    """django-q2's `pre_enqueue` receiver: a refused task becomes a call of `refused_task`.

    Raising here would not do: the scheduler enqueues every due schedule in one transaction,
    so one hostile Schedule would stop all of them. The rewritten task still goes through the
    broker and fails there as a django-q2 failure naming what was refused.
    """
    reason = refusal_reason(task)
    if reason is None:
        return
    _record_task(task, reason=reason, source=RefusedTask.Source.ENQUEUE)
    task["args"] = (describe(task.get("func")), reason)
    task["kwargs"] = {}
    task["func"] = REFUSED_TASK
    task.pop("hook", None)


def refused_task(func: str, reason: str) -> None:
    """What a refused task runs instead of what it named: nothing but a failure."""
    raise TaskRefused(f"refused {func}: {reason}")


BROKER_RETRY_CAP_SECONDS = 5.0  # seconds; the longest wait between polls of a lost broker


@functools.cache
def _broker_reconnect() -> Reconnect:
    """The pusher process's backoff and quiet log (one pusher per cluster)."""
    return Reconnect("django-q2 broker poll", cap=BROKER_RETRY_CAP_SECONDS)


class GuardedOrmBroker(ORM):
    """django-q2's ORM broker that hands the pusher only tasks the worker may run.

    Q_CLUSTER["broker_class"] names it. A refused row is recorded and deleted in one
    transaction; a row whose signature does not verify was never unpickled and is recorded
    and deleted the same way (django-q2's pusher would only log it).
    """

    @staticmethod
    def get_connection(list_key: str | None = None) -> Any:
        """django-q2's `get_connection` without its `close_old_connections()` before every use.

        With `CONN_MAX_AGE=0` (the default) that closed the connection each time, so an idle
        pusher, polling every Q_POLL (0.2 s), opened five PostgreSQL sessions a second (about
        6 % of a core per idle qcluster, most of it in the server forking backends); with the
        pool, a check-out and a health-check round trip per poll. The broker's callers here are
        long-lived loops of one thread (the pusher, the monitor's acknowledgements), so the
        connection is kept while it works; one that has failed is dropped, and `dequeue`
        replaces a dropped session at once (`_take_on_a_working_connection`).
        """
        connection = connections[Conf.ORM]
        if (
            connection.connection is not None
            and not connection.in_atomic_block
            and connection.errors_occurred
        ):
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()
        return OrmQ.objects.using(Conf.ORM)

    def dequeue(self) -> list[tuple[Any, Any]] | None:
        try:
            tasks = self._take_on_a_working_connection()
        except DatabaseError as exc:
            # django-q2's pusher logs any error with a traceback, ends, and is restarted by
            # the sentinel 10 s later: four lines every 10 s through an outage. A lost
            # connection is expected: one line, a count per 30 s, a wait, and no task (I24).
            if not connection_lost(exc):
                raise
            time.sleep(_broker_reconnect().failed(exc))
            return None
        _broker_reconnect().recovered()
        if not tasks:
            return tasks
        kept = []
        for ack_id, payload in tasks:
            try:
                task = SignedPackage.loads(payload)
            except (TypeError, BadSignature) as exc:
                self._refuse(
                    ack_id,
                    func="",
                    reason=f"not signed with this deployment's SECRET_KEY ({type(exc).__name__}): "
                    "never unpickled",
                )
                continue
            reason = refusal_reason(task)
            if reason is None:
                kept.append((ack_id, payload))
                continue
            with transaction.atomic():
                _record_task(task, reason=reason, source=RefusedTask.Source.BROKER)
                self.fail(ack_id)
        return kept

    def _take_on_a_working_connection(self) -> list[tuple[Any, Any]] | None:
        """`_take`, once more on a new connection when the kept one turns out to be gone (the
        server ended the session: pg_terminate_backend, a restart, a failover). Only when the
        new one fails too is the broker lost (the caller's backoff and its log line)."""
        connection = connections[Conf.ORM]
        kept = connection.connection is not None and not connection.in_atomic_block
        try:
            return self._take()
        except DatabaseError as exc:
            if not (kept and connection_lost(exc)):
                raise
            logger.info(
                "django-q2 broker poll: its kept database session was gone (%s); opening a new one",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                extra={"action": "broker_session_replaced"},
            )
            connection.close()
            return self._take()

    def _take(self) -> list[tuple[Any, Any]] | None:
        """django-q2 1.11's `ORM.dequeue`, but an empty broker is waited on through the
        listener's nudge (jobs/pusher_signal.py) instead of a plain sleep of Q_POLL: the
        wake task for a job committed into an idle cluster is taken at once (issue 37,
        point 1). Each row is still taken by moving its lock forward only if no other
        cluster moved it first."""
        rows = self.get_connection().filter(key=self.list_key, lock__lt=timezone.now())[: Conf.BULK]
        if not rows:
            pusher_signal.wait(Conf.POLL)
            return None
        taken = []
        for row in rows:
            moved = (
                self.get_connection()
                .filter(id=row.id, lock=row.lock)
                .update(lock=self.timeout(row))
            )
            if moved:
                taken.append((row.pk, row.payload))
        return taken

    def _refuse(self, ack_id: Any, *, func: str, reason: str) -> None:
        with transaction.atomic():
            record_refusal(
                func=func,
                hook="",
                task_name=f"broker row {ack_id}",
                group="",
                reason=reason,
                source=RefusedTask.Source.BROKER,
            )
            self.fail(ack_id)
