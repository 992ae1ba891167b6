"""Issue 38, point 4: a job per tick, exactly one across schedulers; catch-up; no overlap.

Real database; two schedulers race on threads with their own connections, as two qclusters'
threads do on two hosts.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from jobs.models import Job
from jobs.periodic_scheduler import PeriodicScheduler, fire, periodic_scheduler_running
from jobs.periodic_ticks import Periodic, latest_tick, next_tick
from jobs.runner import run_pending
from project.db_clock import db_now

pytestmark = pytest.mark.django_db(transaction=True)


def _ticks(name: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tick_at, job_id, outcome FROM jobs_periodic_tick WHERE schedule = %s "
            "ORDER BY tick_at",
            [name],
        )
        return cursor.fetchall()


def test_two_schedulers_racing_on_every_tick_enqueue_one_job_per_tick():
    schedule = Periodic(name="race", kind="tests.noop", every=1, overlap=True)
    start = latest_tick(schedule, db_now())
    ticks = [start + timedelta(seconds=i) for i in range(40)]
    barrier = threading.Barrier(2)
    outcomes: list[list[str]] = [[], []]

    def scheduler(me: int) -> None:
        try:
            barrier.wait(timeout=10)
            for tick in ticks:
                outcomes[me].append(fire(schedule, tick))
        finally:
            connection.close()

    threads = [threading.Thread(target=scheduler, args=(me,)) for me in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    both = outcomes[0] + outcomes[1]
    assert both.count("enqueued") == 40 and both.count("taken") == 40
    rows = _ticks("race")
    assert [row[0] for row in rows] == ticks
    assert Job.objects.filter(kind="tests.noop").count() == 40
    assert sorted(row[1] for row in rows) == sorted(Job.objects.values_list("pk", flat=True))


def test_two_running_loops_at_one_second_enqueue_each_tick_once():
    schedule = Periodic(name="loops", kind="tests.noop", every=1, overlap=True)
    with periodic_scheduler_running([schedule]), periodic_scheduler_running([schedule]):
        time.sleep(3.6)
    rows = _ticks("loops")
    assert 2 <= len(rows) <= 5
    assert len({row[0] for row in rows}) == len(rows)
    assert all(b[0] - a[0] == timedelta(seconds=1) for a, b in zip(rows, rows[1:], strict=False))
    assert Job.objects.count() == len(rows)
    assert {row[2] for row in rows} == {"enqueued"}


def test_at_start_the_latest_missed_tick_runs_once_and_the_older_are_skipped_in_one_line(caplog):
    schedule = Periodic(name="missed", kind="tests.noop", every=60, overlap=True)
    now = db_now()
    latest = latest_tick(schedule, now)
    last_run = latest - timedelta(minutes=10)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_periodic_tick (schedule, tick_at, outcome) "
            "VALUES (%s, %s, 'enqueued')",
            ["missed", last_run],
        )
    with caplog.at_level(logging.INFO, logger="jobs.periodic_scheduler"):
        first, second = PeriodicScheduler([schedule]), PeriodicScheduler([schedule])
        first.catch_up(now)
        second.catch_up(now)  # a second qcluster starting at the same time
    assert [row[0] for row in _ticks("missed")] == [last_run, latest]
    assert Job.objects.count() == 1
    skips = [r for r in caplog.records if getattr(r, "action", "") == "periodic_ticks_skipped"]
    assert len(skips) >= 1 and {r.skipped for r in skips} == {9}
    message = skips[0].getMessage()
    assert "9 missed tick(s) skipped" in message
    assert next_tick(schedule, last_run).isoformat() in message
    # The next pass at the same time fires nothing more.
    first.step(now)
    assert Job.objects.count() == 1


def test_a_new_schedule_starts_at_its_next_tick():
    schedule = Periodic(name="new", kind="tests.noop", every=60)
    scheduler = PeriodicScheduler([schedule])
    now = db_now()
    scheduler.catch_up(now)
    assert Job.objects.count() == 0
    scheduler.step(next_tick(schedule, now))
    assert Job.objects.count() == 1


def test_a_tick_is_skipped_while_the_previous_job_runs_unless_overlap_is_allowed(caplog):
    schedule = Periodic(name="slow", kind="tests.noop", every=1)
    t0 = latest_tick(schedule, db_now())
    assert fire(schedule, t0) == "enqueued"
    with caplog.at_level(logging.INFO, logger="jobs.periodic_scheduler"):
        assert fire(schedule, t0 + timedelta(seconds=1)) == "overlap"
    assert any(getattr(r, "action", "") == "periodic_overlap_skipped" for r in caplog.records)
    assert Job.objects.count() == 1
    assert run_pending().completed == 1
    assert fire(schedule, t0 + timedelta(seconds=2)) == "enqueued"
    assert [row[2] for row in _ticks("slow")] == ["enqueued", "overlap", "enqueued"]

    overlapping = Periodic(name="fast", kind="tests.noop", every=1, overlap=True)
    assert fire(overlapping, t0) == "enqueued"
    assert fire(overlapping, t0 + timedelta(seconds=1)) == "enqueued"
    assert Job.objects.filter(status="queued").count() == 3


def test_a_tick_outlives_the_pruning_of_its_job():
    schedule = Periodic(name="pruned", kind="tests.noop", every=60, overlap=True)
    tick = latest_tick(schedule, db_now())
    assert fire(schedule, tick) == "enqueued"
    Job.objects.all().delete()  # what pruning does to the completed row
    assert fire(schedule, tick) == "taken"
    assert Job.objects.count() == 0
