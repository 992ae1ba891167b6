"""The process registry's statements: identity on register, beats and stops on the database
clock (never the host's), a vanished row re-registered."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from processes import services
from processes.models import WorkerProcess

# The statements commit on their own connection.
pytestmark = pytest.mark.django_db(transaction=True)

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)


def _db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_register_records_host_pid_role_version_and_start(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: FAR_FUTURE)  # a host clock 70 years off
    before = _db_now()
    process_id = services.process_register(role="run_jobs", interval=2.0)
    after = _db_now()

    row = WorkerProcess.objects.get(pk=process_id)
    assert (row.role, row.host, row.pid) == ("run_jobs", socket.gethostname(), os.getpid())
    assert row.version == services.software_version() != "unknown"
    # On the database clock: the host's clock is ignored.
    assert before <= row.started_at == row.heartbeat_at <= after
    assert row.gone_after == row.heartbeat_at + timedelta(seconds=6)  # 3 silent beats
    assert row.stopped_at is None and row.current == ""


def test_a_beat_moves_the_heartbeat_and_the_current_work_on_the_database_clock(monkeypatch):
    process_id = services.process_register(role="qcluster worker", interval=1.0)
    WorkerProcess.objects.filter(pk=process_id).update(
        heartbeat_at=FAR_FUTURE - timedelta(days=1)  # as a host clock ahead would have written
    )
    monkeypatch.setattr(timezone, "now", lambda: FAR_FUTURE)

    assert services.process_beat(process_id=process_id, current="job #7 report.render")
    row = WorkerProcess.objects.get(pk=process_id)
    assert abs(row.heartbeat_at - _db_now()) < timedelta(seconds=5)
    assert row.gone_after == row.heartbeat_at + timedelta(seconds=3)
    assert row.current == "job #7 report.render"


def test_a_stopped_or_deleted_row_is_not_beaten_back_to_life():
    process_id = services.process_register(role="run_sweeps", interval=1.0)
    services.process_stop(process_id=process_id)
    row = WorkerProcess.objects.get(pk=process_id)
    assert row.stopped_at is not None

    assert services.process_beat(process_id=process_id, current="") is False
    WorkerProcess.objects.all().delete()
    assert services.process_beat(process_id=process_id, current="") is False


def test_register_deletes_rows_past_the_retention():
    old = services.process_register(role="run_jobs", interval=1.0)
    WorkerProcess.objects.filter(pk=old).update(heartbeat_at=_db_now() - timedelta(days=8))
    new = services.process_register(role="run_jobs", interval=1.0)
    assert list(WorkerProcess.objects.values_list("pk", flat=True)) == [new]


def test_a_task_run_synchronously_in_this_process_starts_no_worker_beacon():
    """django-q2 sends post_spawn in the calling process when it runs a task with sync=True
    (Q_SYNC): a web or test process is not a qcluster worker. Each such task started a beat
    thread that never stopped, and it re-registered its row whenever the row went (a later
    test's flush: it showed as a live "qcluster worker" there)."""
    import threading

    from django_q.signals import post_spawn

    from processes import beacon

    post_spawn.send(sender="django_q", proc_name="MainProcess")
    post_spawn.send(sender="django_q", proc_name="MainProcess")

    assert beacon._beacon is None
    assert not [t for t in threading.enumerate() if t.name.startswith("process-beacon-")]
    assert not WorkerProcess.objects.exists()
