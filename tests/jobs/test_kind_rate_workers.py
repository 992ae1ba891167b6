"""A rate holds across real worker processes, each job starts when its token comes, and a
rate-limited backlog costs nobody's claim anything (issue 38, point 3).

- Two `run_jobs` processes and a qcluster of three workers run `tests.rated` (its handler's
  rate: 5/s): the claims (each claimed row's `heartbeat_at`, the database's clock at its
  claim; the jobs take no time, so no lease renewal moves it) never number more than 6 in
  any one second, and the jobs are done about as fast as the rate allows: an idle `run_jobs`
  sleeps until the next token (not its 1 s poll), a qcluster's listener arms a timer at it.
- 1,000,000 queued rows of a limited kind waiting for its token, back-dated an hour (below
  every floor): the scans on the claim's path read a handful of buffers, not the backlog's,
  and a job of another kind committed next to it starts within a second. The paused- and
  capped-backlog tests (tests/jobs/test_start_within_a_second.py,
  tests/jobs/test_kind_cap_backlog.py), for a rate.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from jobs import selectors
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from jobs.kind_rates import kind_rates_sync
from jobs.models import Job, KindRate
from jobs.selectors import job_due_or_task_waiting
from tests.jobs.handlers import RATED_HOURLY_KIND, RATED_KIND
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
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.django_db(transaction=True)]

PER_SECOND = 5  # tests.rated's "5/s"


def _claims_and_span(kind: str) -> tuple[int, float]:
    """The most claims of `kind` in any one-second window, and the seconds from its first
    claim to its last (the database's clock)."""
    times = sorted(
        Job.objects.filter(kind=kind).values_list("heartbeat_at", flat=True)
    )  # fmt: skip
    window = timedelta(seconds=1)
    peak = max(sum(1 for t in times[n:] if t <= start + window) for n, start in enumerate(times))
    return peak, (times[-1] - times[0]).total_seconds()


def _queue_rated(jobs: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, '{}', 'queued', 0, 0, 3, now(), now(), '', '' "
            "FROM generate_series(1, %s)",
            [RATED_KIND, jobs],
        )


def test_run_jobs_processes_keep_the_rate_and_start_each_job_when_its_token_comes(
    worker_env, tmp_path
):
    jobs = 11  # 2 s of tokens after the first
    kind_rates_sync()
    _queue_rated(jobs)
    env = {**worker_env, "JOBS_POLL_SECONDS": "1"}
    workers = [
        spawn_manage_py(
            "run_jobs",
            env=env,
            stdout=(tmp_path / f"run_jobs{n}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for n in range(2)
    ]
    try:
        wait_until(
            lambda: Job.objects.filter(kind=RATED_KIND, status="completed").count() == jobs,
            "the limited jobs are done",
            60,
            # It took 63 s once in a whole run (3.8 s alone): what the processes said.
            logs=tuple(tmp_path / f"run_jobs{n}.log" for n in range(2)),
        )
    finally:
        for worker in workers:
            stop_process_group(worker)
    peak, span = _claims_and_span(RATED_KIND)
    print(f"{jobs} jobs at {PER_SECOND}/s on 2 run_jobs: at most {peak} a second, {span:.2f}s")
    assert peak <= PER_SECOND + 1
    # 10 intervals of 0.2 s: each token taken within a few tenths of its time, not at a poll
    # (two processes polling each second would take about 5 s).
    assert span <= (jobs - 1) / PER_SECOND + 1.0, span
    assert set(Job.objects.filter(kind=RATED_KIND).values_list("attempts", flat=True)) == {1}
    connections.close_all()


def test_a_qcluster_keeps_the_rate_and_starts_each_job_when_its_token_comes(worker_env, tmp_path):
    jobs = 11
    log = tmp_path / "qcluster.log"
    with _qcluster(_cluster_env(worker_env, Q_WORKERS="3"), log):
        assert "job rates: " in log.read_text()  # the qcluster wrote its rates at start
        _queue_rated(jobs)
        wait_until(
            lambda: Job.objects.filter(kind=RATED_KIND, status="completed").count() == jobs,
            "the limited jobs are done",
            60,
        )
    peak, span = _claims_and_span(RATED_KIND)
    print(f"{jobs} jobs at {PER_SECOND}/s on a qcluster: at most {peak} a second, {span:.2f}s")
    assert peak <= PER_SECOND + 1
    assert span <= (jobs - 1) / PER_SECOND + 1.0, span
    connections.close_all()


def test_a_rate_limited_kinds_million_queued_rows_cost_the_claim_nothing(worker_env, tmp_path):
    """The kind waits for its next token (its handler's 1/h, which the qcluster writes at
    start-up as this test does; the last token taken a minute ago)."""
    kind_rates_sync()
    KindRate.objects.filter(kind=RATED_HOURLY_KIND).update(
        next_slot_at=timezone.now() + timedelta(minutes=59)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, '{}', 'queued', 0, 0, 3, "
            "now() - interval '1 hour' + g * interval '1 ms', now(), '', '' "
            "FROM generate_series(1, %s) AS g",
            [RATED_HOURLY_KIND, BACKLOG],
        )
        # A lane that may run, with nothing due in it: its range is read, the limited one not.
        cursor.execute(
            _INSERT.replace("now(), now()", "now() + interval '1 hour', now()"), ["tests.noop"]
        )
        cursor.execute("VACUUM ANALYZE jobs_job")
    before = KindRate.objects.values_list("next_slot_at", flat=True).get(kind=RATED_HOURLY_KIND)

    costs = {
        "runner claim (full scan)": _runner_step_buffers(),
        "listener due check (full)": explained(due_now_sql(None)),
        "listener look-ahead": explained(LOOK_AHEAD_SQL),
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    costs["linger poll (full scan)"] = explained(selectors._LINGER_SQL, [now, None])
    assert job_due_or_task_waiting(now=timezone.now()).due_run_after is None  # no token
    print("buffers read per scan next to the rate-limited backlog:", json.dumps(costs))
    # A scan that walked the backlog reads ~1,000,000 buffers (one heap visit per row) or,
    # floored, ~4,000 index pages; one that does not, a few dozen.
    assert all(buffers < 200 for buffers in costs.values()), costs
    assert (
        KindRate.objects.values_list("next_slot_at", flat=True).get(kind=RATED_HOURLY_KIND)
        == before
    )

    log = tmp_path / "qcluster.log"
    with _qcluster(_cluster_env(worker_env), log):
        with _traffic():
            time.sleep(3)  # the workers' floors climb, their full scans run
            job_id, committing = _back_dated_commit()
            wait = _started_after_commit(job_id, committing, log)
    print(f"commit to start next to the rate-limited backlog: {wait:.3f}s")
    assert 0 <= wait <= GUARANTEE_SECONDS
    assert Job.objects.filter(kind=RATED_HOURLY_KIND, status="queued").count() == BACKLOG
    connections.close_all()
