"""Issue 38, points 4 and 9, what was left of `jobs.periodic`: the tick rows are pruned
(keeping what "one job per tick" needs), a schedule whose kind has no handler and the
hostile declarations stop a qcluster's start with an error naming them."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse

from jobs.exceptions import InvalidSchedule
from jobs.models import JobPruneRun
from jobs.periodic_scheduler import PeriodicScheduler, fire
from jobs.periodic_ticks import Periodic, checked_schedules, forget, periodic
from jobs.pruning import jobs_prune
from project.db_clock import db_now
from tests.support.processes import spawn_manage_py, stop_process_group

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_ticks():
    """jobs_periodic_tick has no model: a transactional test's flush leaves other tests'
    ticks there (they would count here, and these tests' old ticks in another's pruning)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_periodic_tick")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_periodic_tick")


def _tick(schedule: str, days_ago: float, job_id: int | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_periodic_tick (schedule, tick_at, job_id, outcome) "
            "VALUES (%s, date_trunc('second', now()) - make_interval(days => %s), %s, %s)",
            [schedule, days_ago, job_id, "overlap" if job_id is None else "enqueued"],
        )


def _days_kept() -> dict[str, list[int]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT schedule, round(extract(epoch FROM now() - tick_at) / 86400)::int "
            "FROM jobs_periodic_tick ORDER BY schedule, tick_at"
        )
        kept: dict[str, list[int]] = {}
        for schedule, days in cursor.fetchall():
            kept.setdefault(schedule, []).append(days)
        return kept


def test_old_ticks_are_pruned_but_each_schedules_latest_and_latest_enqueued_stay(
    settings, admin_client
):
    """Kept for the longest job retention (30 days here: a tick outlives its job's pruning),
    and whatever its age each schedule's latest tick (catch-up and "one job per tick" start
    from it) and its latest enqueued one (the overlap check's job)."""
    settings.JOBS_RETENTION_DAYS = 14
    settings.JOBS_FAILED_RETENTION_DAYS = 30
    settings.JOBS_CANCELLED_RETENTION_DAYS = 7
    for days in (40, 35, 31, 29, 1):
        _tick("a", days, job_id=days)
    for days in (100, 90):  # a weekly schedule that stopped, or left the code
        _tick("b", days, job_id=days)
    _tick("c", 50, job_id=50)  # its job still runs: the later ticks were skipped
    _tick("c", 45)
    _tick("c", 40)

    result = jobs_prune(batch=2)

    assert result.periodic_ticks == 5
    assert _days_kept() == {"a": [29, 1], "b": [90], "c": [50, 40]}
    assert JobPruneRun.objects.get().periodic_ticks == 5
    page = admin_client.get(reverse("ops:worker_health")).content.decode()
    assert "5 periodic ticks" in page  # the health page says what pruning deleted
    assert jobs_prune().periodic_ticks == 0


def test_a_pruned_schedule_neither_fires_its_kept_tick_again_nor_catches_up_older_ones(settings):
    settings.JOBS_RETENTION_DAYS = 0
    settings.JOBS_FAILED_RETENTION_DAYS = 0
    settings.JOBS_CANCELLED_RETENTION_DAYS = 0
    schedule = Periodic(name="daily", kind="tests.noop", every=86400, overlap=True)
    # On the schedule's own ticks (midnight UTC): a tick an hour after an unaligned one could
    # be a real due tick (the test failed when run between 23:00 and midnight).
    midnight = db_now().replace(hour=0, minute=0, second=0, microsecond=0)
    ticks = [midnight - timedelta(days=n) for n in (3, 2)]
    for tick in ticks:
        assert fire(schedule, tick) == "enqueued"

    assert jobs_prune().periodic_ticks == 1  # at least a day is kept: the 3-day-old one goes

    assert fire(schedule, ticks[1]) == "taken"
    scheduler = PeriodicScheduler([schedule])
    scheduler.catch_up(ticks[1] + timedelta(hours=1))
    assert scheduler.fired == {}


def test_a_schedule_whose_kind_has_no_handler_is_refused_naming_it():
    periodic("tests.no_such_handler", name="tests.orphan", every=60)
    try:
        with pytest.raises(InvalidSchedule, match=r"'tests\.orphan'.*'tests\.no_such_handler'"):
            checked_schedules()
    finally:
        forget("tests.orphan")
    assert "tests.orphan" not in [schedule.name for schedule in checked_schedules()]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "options", "words"),
    [
        (
            "tests.jobs.periodic_orphan",
            {},
            "periodic 'tests.orphan_at_start': no handler is registered for kind "
            "'tests.no_such_kind'",
        ),
        ("tests.jobs.periodic_hostile", {"cron": "0 0 30 2 *"}, "bad cron line '0 0 30 2 *'"),
        ("tests.jobs.periodic_hostile", {"every": 0}, "every=0 s is below the minimum"),
        ("tests.jobs.periodic_hostile", {"every": -5}, "every=-5 s is below the minimum"),
        (
            "tests.jobs.periodic_hostile",
            {"cron": "0 9 * * *", "tz": "Mars/Olympus"},
            "unknown time zone 'Mars/Olympus'",
        ),
    ],
)
def test_a_qcluster_refuses_to_start_with_a_bad_schedule(module, options, words, worker_env):
    env = {
        **worker_env,
        "JOBS_EXTRA_HANDLER_MODULES": f"tests.jobs.handlers,{module}",
        "TEST_PERIODIC_OPTIONS": json.dumps(options),
    }
    process = spawn_manage_py(
        "qcluster",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        text, _ = process.communicate(timeout=60)
    finally:
        stop_process_group(process)  # a qcluster that started after all
    assert process.returncode != 0, text[-3000:]
    assert words in text, text[-3000:]
    assert "InvalidSchedule" in text
    assert "periodic schedules:" not in text  # stopped before the cluster's start
