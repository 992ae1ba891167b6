"""Issue 20, point 2: each schedule's last run, result and next run, and an overdue flag
(no run for two intervals) that turns the health page red and fails worker_status."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.models import Schedule, Task
from model_bakery import baker

from ops.schedule_status import schedule_runs
from ops.schedules import SCHEDULES, ensure_schedules
from ops.status import worker_status
from processes.models import WorkerProcess

pytestmark = pytest.mark.django_db

HEALTH_URL = "/admin/worker-health/"
POLL = "inbound email: poll"  # every minute
DIGEST = "notifications: digest sweep"  # every 60 minutes


def _ran(name: str, *, ago: timedelta, success: bool = True, took: float = 0.5) -> None:
    started = timezone.now() - ago
    Task.objects.create(
        id=uuid.uuid4().hex,
        name=f"{name}-run",
        func="x.y",
        group=name,
        started=started,
        stopped=started + timedelta(seconds=took),
        success=success,
    )


@pytest.fixture
def schedules_running() -> None:
    """Every schedule ran within its interval, as under a live qcluster."""
    ensure_schedules()
    Schedule.objects.update(next_run=timezone.now() + timedelta(seconds=30))
    for spec in SCHEDULES:
        _ran(spec.name, ago=timedelta(seconds=20))


def test_each_schedule_shows_its_last_run_result_and_next_run(schedules_running):
    _ran(DIGEST, ago=timedelta(seconds=10), success=False, took=2.0)  # newer, and failed
    runs = {run.name: run for run in schedule_runs(now=timezone.now())}
    assert set(runs) == {spec.name for spec in SCHEDULES}
    digest = runs[DIGEST]
    assert (digest.last_result, digest.last_run_seconds, digest.overdue) == ("failed", 2.0, False)
    assert digest.interval_seconds == 3600
    assert digest.next_run > timezone.now()
    assert runs[POLL].last_result == "ok" and not runs[POLL].overdue


def test_a_schedule_without_a_run_for_two_intervals_is_overdue(schedules_running, capsys):
    call_command("worker_status")  # all on time: exit 0
    Task.objects.filter(group=POLL).update(started=timezone.now() - timedelta(seconds=125))
    _ran(DIGEST, ago=timedelta(minutes=110))  # 1 h 50 min for an hourly one: not yet
    Task.objects.filter(group=DIGEST, started__gt=timezone.now() - timedelta(minutes=5)).delete()

    runs = {run.name: run for run in schedule_runs(now=timezone.now())}
    assert runs[POLL].overdue and not runs[DIGEST].overdue

    with pytest.raises(CommandError) as excinfo:
        call_command("worker_status")
    assert excinfo.value.returncode == 1
    out = capsys.readouterr().out
    assert f"schedule '{POLL}' has not run for 2 min (every 1 min): is the qcluster running?" in out
    assert "OVERDUE inbound email: poll" in out

    with pytest.raises(CommandError):
        call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    overdue = [s["name"] for s in report["schedules"] if s["overdue"]]
    assert overdue == [POLL]


def test_a_schedule_that_never_ran_is_overdue_an_interval_after_it_was_due(db):
    ensure_schedules()
    Schedule.objects.update(next_run=timezone.now() - timedelta(seconds=30))
    assert not any(run.overdue for run in schedule_runs(now=timezone.now()))
    Schedule.objects.filter(name=POLL).update(next_run=timezone.now() - timedelta(seconds=90))
    runs = {run.name: run for run in schedule_runs(now=timezone.now())}
    assert runs[POLL].overdue and runs[POLL].last_result == "never ran"


def test_an_overdue_schedule_turns_the_health_page_red(admin_client, schedules_running):
    page = admin_client.get(HEALTH_URL).content.decode()
    assert 'id="content-main">' in page and 'class="overdue"' not in page

    Task.objects.filter(group=POLL).update(started=timezone.now() - timedelta(minutes=3))
    page = admin_client.get(HEALTH_URL).content.decode()
    assert '<div id="content-main" class="health-alert">' in page
    row = page[page.index('<tr class="overdue">') :].split("</tr>")[0]
    assert POLL in row and "OVERDUE" in row and "1 min" in row
    assert f"schedule &#x27;{POLL}&#x27; has not run for 3 min (every 1 min)" in page


def test_the_schedule_status_costs_two_queries_whatever_the_runs(
    schedules_running, django_assert_num_queries
):
    for _ in range(20):
        _ran(POLL, ago=timedelta(minutes=5))
    with django_assert_num_queries(2):
        schedule_runs(now=timezone.now())


def _qcluster(*, started_ago: timedelta, live: bool = True) -> WorkerProcess:
    now = timezone.now()
    return baker.make(
        WorkerProcess,
        role=WorkerProcess.Role.QCLUSTER,
        host="host-a",
        pid=4242,
        version="1",
        started_at=now - started_ago,
        heartbeat_at=now,
        interval_seconds=10,
        gone_after=now + (timedelta(seconds=30) if live else -timedelta(seconds=1)),
    )


def _overdue() -> list[str]:
    return sorted(s["name"] for s in worker_status().schedules if s["overdue"])


def test_after_a_restart_nothing_is_overdue_before_the_scheduler_has_had_its_pass(
    schedules_running,
):
    """Issue 36.8: after every restart of a worker that was down a few minutes, the six
    one-minute schedules showed OVERDUE for 30 s: django-q2's scheduler first looks at the
    schedules SCHEDULER_PASS_SECONDS after the cluster starts (and every 30 s after). A
    schedule is given that pass and then its interval, counted from the cluster's start."""
    Task.objects.filter(group__in=[spec.name for spec in SCHEDULES]).update(
        started=timezone.now() - timedelta(minutes=10)  # the worker was down 10 minutes
    )
    Schedule.objects.update(next_run=timezone.now() - timedelta(minutes=9))
    minute = sorted(spec.name for spec in SCHEDULES if spec.minutes == 1)
    assert len(minute) == 6

    _qcluster(started_ago=timedelta(seconds=2))  # just started: its first pass is to come
    assert _overdue() == []

    WorkerProcess.objects.update(started_at=timezone.now() - timedelta(seconds=85))
    assert _overdue() == []  # its pass at 30 s, then one minute to run them

    WorkerProcess.objects.update(started_at=timezone.now() - timedelta(seconds=95))
    assert _overdue() == minute  # a pass and a whole minute: they should have run


def test_without_a_live_cluster_the_grace_does_not_apply(schedules_running):
    """A cluster that stopped (or another one started long ago) gives no grace: the
    schedules have no scheduler to wait for."""
    Task.objects.filter(group=POLL).update(started=timezone.now() - timedelta(minutes=10))
    _qcluster(started_ago=timedelta(seconds=2), live=False)
    assert POLL in _overdue()

    _qcluster(started_ago=timedelta(hours=2))  # runs beside the one that just started
    _qcluster(started_ago=timedelta(seconds=2))
    assert POLL in _overdue()
