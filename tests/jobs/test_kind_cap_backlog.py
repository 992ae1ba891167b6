"""A cap holds across real worker processes, and a capped backlog costs nobody's claim
anything (issue 37, point 2).

- Three qcluster worker processes (each with its slots) run `tests.capped` (its handler's
  cap: 2) and log when each job ran: never more than 2 at once, though 12 could.
- 1,000,000 queued rows of a kind at its cap, back-dated an hour (below every floor): the
  scans on the claim's path (the runner's claim and its `more_due`, the linger poll, the
  listener's due check and look-ahead), each a full scan, read a handful of buffers, not the
  backlog's, and a job of another kind committed next to it starts within a second. The
  paused-backlog test of issue 36 (tests/jobs/test_start_within_a_second.py), for a cap.
"""

from __future__ import annotations

import json
import time

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs import enqueue, selectors
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from jobs.models import Job, KindCap
from jobs.selectors import job_due_or_task_waiting
from tests.jobs.handlers import CAPPED_CONCURRENCY, CAPPED_KIND, CAPPED_ONE_KIND
from tests.jobs.test_start_within_a_second import (
    _INSERT,
    BACKLOG,
    GUARANTEE_SECONDS,
    _back_dated_commit,
    _cluster_env,
    _runner_step_buffers,
    _started_after_commit,
    _traffic,
)
from tests.jobs.test_wakeup import _qcluster
from tests.support.plans import explained
from tests.support.processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_three_worker_processes_never_run_more_than_the_cap_at_once(worker_env, tmp_path):
    log = tmp_path / "capped.log"
    jobs = 12
    cluster_log = tmp_path / "qcluster.log"
    with _qcluster(_cluster_env(worker_env, Q_WORKERS="3"), cluster_log):
        with transaction.atomic():  # committed once the listener is up
            for n in range(jobs):
                enqueue(CAPPED_KIND, {"n": n, "log": str(log), "sleep": 0.4})
        wait_until(
            lambda: Job.objects.filter(kind=CAPPED_KIND, status="completed").count() == jobs,
            "the capped jobs are done",
            60,
        )
    events = []
    for line in log.read_text().splitlines():
        what, _n, at = line.split()
        events.append((float(at), 1 if what == "start" else -1))
    running = peak = 0
    for _at, change in sorted(events, key=lambda e: (e[0], e[1])):
        running += change
        peak = max(peak, running)
    print(f"{jobs} capped jobs on 3 worker processes: at most {peak} at once")
    assert peak == CAPPED_CONCURRENCY, peak  # never more, and the cap's units were used
    assert set(Job.objects.filter(kind=CAPPED_KIND).values_list("attempts", flat=True)) == {1}
    connections.close_all()


def test_a_capped_kinds_million_queued_rows_cost_the_claim_nothing(worker_env, tmp_path):
    """The kind is at its cap (its handler's 1, which the qcluster writes at start-up as
    this test does; the unit held by a row another host's worker runs for minutes)."""
    KindCap.objects.create(kind=CAPPED_ONE_KIND, concurrency=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error, heartbeat_at, lease_expires_at) "
            "VALUES (%s, '{}', 'processing', 0, 1, 3, now(), now(), "
            "'elsewhere', '', now(), now() + interval '10 minutes')",
            [CAPPED_ONE_KIND],
        )
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, '{}', 'queued', 0, 0, 3, "
            "now() - interval '1 hour' + g * interval '1 ms', now(), '', '' "
            "FROM generate_series(1, %s) AS g",
            [CAPPED_ONE_KIND, BACKLOG],
        )
        # A lane that may run, with nothing due in it: its range is read, the capped one not.
        cursor.execute(
            _INSERT.replace("now(), now()", "now() + interval '1 hour', now()"), ["tests.noop"]
        )
        cursor.execute("VACUUM ANALYZE jobs_job")

    costs = {
        "runner claim (full scan)": _runner_step_buffers(),
        "listener due check (full)": explained(due_now_sql(None)),
        "listener look-ahead": explained(LOOK_AHEAD_SQL),
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    costs["linger poll (full scan)"] = explained(selectors._LINGER_SQL, [now, None])
    assert job_due_or_task_waiting(now=timezone.now()).due_run_after is None  # at its cap
    print("buffers read per scan next to the capped backlog:", json.dumps(costs))
    # A scan that walked the backlog reads ~1,000,000 buffers (one heap visit per row) or,
    # floored, ~4,000 index pages; one that does not, a few dozen.
    assert all(buffers < 200 for buffers in costs.values()), costs

    log = tmp_path / "qcluster.log"
    with _qcluster(_cluster_env(worker_env), log):
        with _traffic():
            time.sleep(3)  # the workers' floors climb, their full scans run
            job_id, committing = _back_dated_commit()
            wait = _started_after_commit(job_id, committing, log)
    print(f"commit to start next to the capped backlog: {wait:.3f}s")
    assert 0 <= wait <= GUARANTEE_SECONDS
    assert Job.objects.filter(kind=CAPPED_ONE_KIND, status="queued").count() == BACKLOG
    connections.close_all()
