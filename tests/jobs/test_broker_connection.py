"""The pusher's broker keeps its database session (ops/task_guard.py, GuardedOrmBroker).

django-q2's ORM broker called Django's `close_old_connections()` before every use: with
`CONN_MAX_AGE=0` (the default) each poll of an idle pusher, five a second at Q_POLL's 0.2 s,
opened a new PostgreSQL session, about 6 % of a core per idle qcluster between the two sides;
with the pool, a check-out and its health check. The broker now keeps a working connection and
replaces one that failed before the next use, without calling the failure an outage.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from django_q.brokers import get_broker
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from ops.task_guard import GuardedOrmBroker, _broker_reconnect
from tests.jobs.test_wakeup import _qcluster
from tests.support.processes import test_database_url as database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _sessions() -> int:
    """Sessions ever opened to the test database (PostgreSQL 14+), through a connection of
    its own so that reading it opens none in Django's."""
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        (sessions,) = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return sessions


@pytest.mark.slow
def test_an_idle_qclusters_broker_polls_open_no_new_database_sessions(worker_env, tmp_path):
    """With Q_POLL at 0.1 s, 3 idle seconds are 30 polls of the pusher: each was a new
    session. A few may open for other reasons (a heartbeat's first write, this test's own
    reads); none per poll."""
    env = {**worker_env, "Q_WORKERS": "2", "Q_POLL": "0.1", "LOG_LEVEL": "INFO"}
    with _qcluster(env, tmp_path / "qcluster.log"):
        time.sleep(2.0)  # start-up done: its tasks taken, the pusher polling an empty broker
        before = _sessions()
        time.sleep(3.0)
        opened = _sessions() - before - 1  # this test's own second read
    print(f"sessions opened by an idle qcluster in 3 s: {opened}")
    assert opened <= 3, f"{opened} sessions opened by an idle qcluster in 3 s"


def _past() -> datetime:
    return timezone.now() - timedelta(seconds=1)


def _task_row() -> OrmQ:
    task = {
        "id": "t1",
        "name": "t1",
        "func": "jobs.tasks.reap_stale_jobs",
        "args": (),
        "kwargs": {},
    }
    return OrmQ.objects.create(
        key=get_broker().list_key, payload=SignedPackage.dumps(task), lock=_past()
    )


def test_a_kept_broker_connection_the_server_dropped_is_replaced_at_once(caplog):
    """A terminated session (an operator's pg_terminate_backend, a failover) is noticed at the
    next poll and replaced in that poll: the task is handed over, nothing is logged as a lost
    broker and no backoff is waited."""
    broker = GuardedOrmBroker(list_key=get_broker().list_key)
    row = _task_row()
    assert [ack for ack, _ in broker.dequeue()] == [row.pk]  # the broker's connection is up
    kept = connection.connection.info.backend_pid
    OrmQ.objects.filter(pk=row.pk).update(lock=_past())  # queued again
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [kept])
    caplog.set_level(logging.INFO)

    handed = broker.dequeue()

    assert [ack for ack, _ in handed] == [row.pk]
    assert connection.connection.info.backend_pid != kept
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert _broker_reconnect().failures == 0  # no backoff was waited
