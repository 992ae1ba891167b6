"""Live and gone are judged on the database clock: 3 silent intervals, or a clean stop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from processes import services
from processes.models import WorkerProcess
from processes.selectors import processes_gone, processes_listed, processes_live

pytestmark = pytest.mark.django_db(transaction=True)


def test_live_silent_stopped_and_long_gone_processes(monkeypatch):
    live = services.process_register(role="run_jobs", interval=10.0)
    silent = services.process_register(role="qcluster worker", interval=10.0)
    stopped = services.process_register(role="run_sweeps", interval=10.0)
    long_gone = services.process_register(role="poll_inbound_email", interval=10.0)
    # `silent` last beat 31 s ago: three 10 s intervals without a beat.
    WorkerProcess.objects.filter(pk=silent).update(
        heartbeat_at=Now() - timedelta(seconds=31), gone_after=Now() - timedelta(seconds=1)
    )
    services.process_stop(process_id=stopped)
    WorkerProcess.objects.filter(pk=long_gone).update(
        heartbeat_at=Now() - timedelta(hours=2), gone_after=Now() - timedelta(hours=2)
    )
    # A host clock far ahead (or behind) changes nothing: only the database's counts.
    monkeypatch.setattr(timezone, "now", lambda: datetime(2100, 1, 1, tzinfo=UTC))

    assert set(processes_live().values_list("pk", flat=True)) == {live}
    assert set(processes_gone().values_list("pk", flat=True)) == {silent, stopped, long_gone}
    listed = {row.pk: row.live for row in processes_listed()}
    assert listed == {live: True, silent: False, stopped: False}
    assert next(iter(processes_listed())).pk == live  # live first
