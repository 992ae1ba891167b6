"""The claim's lanes (jobs/lanes.py, migration 0016): a queued row is claimed only through
its (kind, priority) lane, which the jobs table's trigger writes whoever inserts the row; a
row written with the triggers off gets its lane from the reaper's minute schedule."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.lanes import job_lanes_repair
from jobs.models import Job, JobLane
from jobs.runner import run_pending
from jobs.tasks import reap_stale_jobs
from tests.support.wakeup import plain_insert, raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_producer_writes_the_lane_of_what_it_queues_once():
    plain_insert("tests.noop")
    plain_insert("tests.noop")
    with connection.cursor() as cursor:  # another priority, and an UPDATE into a new lane
        cursor.execute("UPDATE jobs_job SET priority = 7 WHERE id = (SELECT min(id) FROM jobs_job)")
    assert sorted(JobLane.objects.values_list("kind", "priority")) == [
        ("tests.noop", 0),
        ("tests.noop", 7),
    ]
    assert run_pending().completed == 2


def test_a_row_written_with_the_triggers_off_is_claimed_once_the_minute_schedule_wrote_its_lane(
    caplog,
):
    with raw_connection() as restore:
        restore.execute("SET session_replication_role = replica")
        restore.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "VALUES ('tests.noop', '{}', 'queued', 3, 0, 3, now(), now(), '', '')"
        )
    assert run_pending().completed == 0  # no lane: the claim does not ask for it
    reap_stale_jobs()
    assert "wrote 1 missing job lanes" in caplog.text
    assert run_pending().completed == 1
    assert job_lanes_repair() == 0
    assert Job.objects.get().status == Job.Status.COMPLETED
