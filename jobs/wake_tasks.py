"""The wake tasks in django-q2's broker: how many are outstanding and pending
(`wake_tasks_in_broker`), and `request_wake`, which sends one (`jobs.tasks.run_due_jobs`)
only when none is pending and fewer than `workers` + 1 are outstanding, so a burst of 150
inserts/s leaves at most workers + 1 wake tasks in the broker. Apart from the listener
(jobs/wakeup.py) because a drain that sees more due jobs than it took asks through it too
(jobs/tasks.py), and the bound must hold across both.

The task carries no job id: the Job table stays the truth, and a running drain claims until
nothing is due, so a job inserted while every worker drains is picked up by those drains.
"""

from __future__ import annotations

import secrets

from django.db import connection, transaction
from django.utils import timezone

from jobs import pusher_signal

WAKE_TASK = "jobs.tasks.run_due_jobs"
WAKE_TASK_NAME = "jobs wake-up"
WAKE_LOCK_KEY = 0x6A6F6273_77616B65 & 0x7FFFFFFFFFFFFFFF  # "jobswake": request_wake's xact lock


def wake_tasks_in_broker(*, funcs: dict[int, str] | None = None) -> tuple[int, int]:
    """(outstanding, pending) wake tasks in django-q2's ORM broker for this cluster.

    Outstanding: queued or taken by a cluster and not yet acknowledged. Pending: not taken
    yet (the ORM broker marks a taken task by moving its `lock` into the future). `funcs`
    caches each row's function by id (a row's payload never changes), so a listener decodes
    each signed payload once, not on every check.
    """
    from django_q.brokers import get_broker
    from django_q.models import OrmQ

    funcs = {} if funcs is None else funcs
    now = timezone.now()
    rows = list(OrmQ.objects.filter(key=get_broker().list_key).values_list("id", "lock"))
    present = {pk for pk, _lock in rows}
    for pk in set(funcs) - present:
        del funcs[pk]
    unknown = present - set(funcs)
    if unknown:  # an undecodable row reads as a task of no function (django-q2's OrmQ.task)
        for row in OrmQ.objects.filter(pk__in=unknown).only("id", "payload"):
            funcs[row.pk] = row.func()
    outstanding = pending = 0
    for pk, lock in rows:
        if funcs.get(pk) == WAKE_TASK:
            outstanding += 1
            pending += lock is None or lock <= now
    return outstanding, pending


def send_wake_task() -> None:
    from django_q.tasks import async_task

    async_task(WAKE_TASK, task_name=f"{WAKE_TASK_NAME} {secrets.token_hex(4)}")


def request_wake(*, workers: int, funcs: dict[int, str] | None = None) -> bool:
    """Send a wake task unless one is pending or `workers` + 1 are outstanding; True if sent."""
    # Count and send under one transaction-level lock (PgBouncer-safe): the listener and
    # every worker's drain ask, and a count-then-send without it let two of them pass the
    # bound together (5 wake tasks with 2 workers, once a drain took batches).
    with transaction.atomic(), connection.cursor() as cursor:
        # Not worth a WAL flush (0.6 ms on a quiet disk, tens of ms beside other fsyncs, on
        # the path of every wake-up): a wake task lost with a server crash is one the minute
        # schedule's drain stands in for, as for a lost NOTIFY; the Job table stays the truth.
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [WAKE_LOCK_KEY])
        outstanding, pending = wake_tasks_in_broker(funcs=funcs)
        if pending or outstanding >= workers + 1:
            return False
        send_wake_task()  # the ORM broker writes on this connection: it commits with the lock
    pusher_signal.nudge()  # committed: the pusher reads it now, not at its next poll
    return True
