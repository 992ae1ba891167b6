"""Issue 38, point 4: the health page and `worker_status` list the `jobs.periodic` schedules
beside the django-q2 ones: last tick, next tick, and overdue when a tick went by unrecorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

import jobs
from jobs.periodic_ticks import forget
from ops.periodic_status import GRACE_SECONDS, periodic_runs
from ops.schedules import ensure_schedules

pytestmark = pytest.mark.django_db

HEALTH_URL = "/admin/worker-health/"
NAME = "tests: every minute"


@pytest.fixture
def every_minute() -> Iterator[str]:
    jobs.periodic("tests.noop", every=60, name=NAME)
    yield NAME
    forget(NAME)


def _ticked(at: datetime, *, job_id: int | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_periodic_tick (schedule, tick_at, job_id, outcome) "
            "VALUES (%s, %s, %s, 'enqueued')",
            [NAME, at, job_id],
        )


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def test_a_schedule_shows_its_last_tick_and_next_tick_and_is_on_time(every_minute):
    now = datetime(2026, 12, 7, 12, 0, 30, tzinfo=UTC)
    _ticked(_minute(now), job_id=812)
    run = {r.name: r for r in periodic_runs(now=now, cluster_started=None)}[NAME]
    assert (run.kind, run.every, run.last_outcome, run.last_job_id) == (
        "tests.noop",
        "every 60 s",
        "enqueued",
        812,
    )
    assert run.last_tick_at == _minute(now)
    assert run.next_tick_at == _minute(now) + timedelta(minutes=1)
    assert not run.overdue and run.missed_tick_at is None


def test_a_tick_that_went_by_unrecorded_is_overdue_and_needs_an_operator(every_minute, capsys):
    ensure_schedules()  # the django-q2 schedules are not what this test is about
    now = timezone.now()
    _ticked(_minute(now) - timedelta(minutes=5))
    runs = {r.name: r for r in periodic_runs(now=now, cluster_started=None)}
    expected = _minute(now - timedelta(seconds=GRACE_SECONDS))
    assert runs[NAME].overdue and runs[NAME].missed_tick_at == expected

    with pytest.raises(CommandError):
        call_command("worker_status")
    out = capsys.readouterr().out
    assert f"OVERDUE {NAME}" in out
    assert f"periodic job '{NAME}' (every 60 s) missed its tick of" in out
    with pytest.raises(CommandError):
        call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in report["periodic"] if p["overdue"]] == [NAME]


def test_a_tick_within_its_grace_is_not_overdue(every_minute):
    now = datetime(2026, 12, 7, 12, 0, 50, tzinfo=UTC)  # the 12:00 tick is 50 s old
    _ticked(datetime(2026, 12, 7, 11, 59, tzinfo=UTC))
    run = {r.name: r for r in periodic_runs(now=now, cluster_started=None)}[NAME]
    assert not run.overdue


def test_a_schedule_that_never_ticked_is_judged_from_the_clusters_start(every_minute):
    now = datetime(2026, 12, 7, 12, 10, 0, tzinfo=UTC)
    never = {r.name: r for r in periodic_runs(now=now, cluster_started=None)}[NAME]
    assert (never.last_outcome, never.overdue) == ("never", False)  # no cluster: not judged
    started = now - timedelta(seconds=30)  # a new schedule starts at its next tick
    assert not {r.name: r for r in periodic_runs(now=now, cluster_started=started)}[NAME].overdue
    started = now - timedelta(minutes=5)
    assert {r.name: r for r in periodic_runs(now=now, cluster_started=started)}[NAME].overdue


def test_an_overdue_periodic_job_turns_the_health_page_red(admin_client, every_minute):
    ensure_schedules()
    now = timezone.now()
    _ticked(_minute(now) - timedelta(minutes=5))
    page = admin_client.get(HEALTH_URL).content.decode()
    table = page[page.index('id="periodic"') :].split("</table>")[0]
    row = table[table.index('<tr class="overdue">') :].split("</tr>")[0]
    assert NAME in row and "every 60 s" in row and "OVERDUE" in row
    assert f"periodic job &#x27;{NAME}&#x27; (every 60 s) missed its tick of" in page
