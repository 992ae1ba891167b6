"""Issue 32, point 3: the qcluster rolls up the counter deltas every OPS_ROLLUP_SECONDS.

Every reader (the health page, worker_status, /metrics) sums the deltas not rolled up yet:
at 1,000 jobs/s a minute of them cost the health page 430–650 ms and /metrics 700 ms
(bench/console.py). django-q2 schedules at most once a minute, so the qcluster command rolls
up on a thread of its own every few seconds (ops/rollup_ticker.py).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule

from jobs import enqueue
from jobs.models import Job, JobCountDelta
from jobs.runner import run_pending
from jobs.selectors import job_status_counts
from ops.models import JobPeriodDelta, MetricDelta
from ops.rates import read_series
from ops.rollup_ticker import THREAD_NAME, rollup_ticker_running
from tests.jobs import handlers  # noqa: F401 - registers tests.noop in this process
from tests.support.processes import (
    schedules_already_run,
    spawn_manage_py,
    stop_process_group,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _pending() -> int:
    return (
        JobCountDelta.objects.count() + MetricDelta.objects.count() + JobPeriodDelta.objects.count()
    )


def _figures() -> tuple[dict[str, int], int]:
    return job_status_counts(), read_series()["jobs_completed"]["tests.noop"].count


def test_the_ticker_folds_the_deltas_every_few_seconds_and_keeps_the_figures():
    for _ in range(3):
        enqueue("tests.noop", {})
    assert run_pending().completed == 3
    before = _figures()
    assert _pending() > 0
    with rollup_ticker_running(interval=0.1) as ticker:
        wait_until(lambda: _pending() == 0, "every delta rolled up", timeout=10)
        enqueue("tests.noop", {})  # a later statement's deltas go the same way
        wait_until(lambda: _pending() == 0, "the new deltas rolled up", timeout=10)
        # The ticker counts a rollup after its commit, which the wait above may see first
        # (seen on a loaded machine: 1 counted when the deltas were already gone).
        wait_until(lambda: ticker.rollups >= 2, "two rollups that moved deltas", timeout=5)
        assert ticker.rollups >= 2
    assert job_status_counts()["queued"] == before[0]["queued"] + 1
    assert _figures()[1] == before[1] == 3
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]


def test_a_failing_rollup_is_one_line_then_a_line_when_it_works_again(caplog):
    """A rollup that fails (here its SQL function is missing for a while) logs once with
    its cause, not once per tick, moves nothing, and says when it works again."""
    enqueue("tests.noop", {})
    with connection.cursor() as cursor:
        cursor.execute("ALTER FUNCTION jobs_count_rollup() RENAME TO jobs_count_rollup_away")
    try:
        with caplog.at_level(logging.INFO, logger="ops.rollup_ticker"):
            with rollup_ticker_running(interval=0.05):
                time.sleep(0.6)  # a dozen ticks, each failing
                assert JobCountDelta.objects.exists()  # nothing moved, nothing lost
                with connection.cursor() as cursor:
                    cursor.execute(
                        "ALTER FUNCTION jobs_count_rollup_away() RENAME TO jobs_count_rollup"
                    )
                wait_until(lambda: not JobCountDelta.objects.exists(), "rolled up again", 10)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DO $$ BEGIN ALTER FUNCTION jobs_count_rollup_away() RENAME TO "
                "jobs_count_rollup; EXCEPTION WHEN undefined_function THEN NULL; END $$"
            )
    lines = [r for r in caplog.records if r.name == "ops.rollup_ticker"]
    failed = [r for r in lines if "counter rollup: could not fold" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in lines]
    assert "jobs_count_rollup() does not exist" in failed[0].getMessage()
    assert failed[0].levelno == logging.ERROR  # not a lost connection: it needs a look
    assert any("working again" in r.getMessage() for r in lines)
    assert job_status_counts()["queued"] == 1


@pytest.mark.slow
def test_the_qcluster_rolls_up_within_seconds_not_at_the_minute_schedule(subprocess_env, tmp_path):
    """The real command: with the minute schedule moved an hour away, the deltas of a job
    run by the cluster are rolled up within a few seconds."""
    log = tmp_path / "qcluster.log"
    env = {
        **subprocess_env,
        "Q_WORKERS": "1",
        "OPS_ROLLUP_SECONDS": "0.5",
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
    }
    # The minute schedules (the roll-up's among them) an hour away before the cluster starts;
    # the job is committed once the wake-up listener is up, so the cluster starts it at once
    # (committed before, nothing tells the cluster of it until a scheduler pass).
    schedules_already_run()
    assert Schedule.objects.get(name="ops: roll up counters").next_run > timezone.now()
    with log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(lambda: "jobs_job_due" in log.read_text(), "the wake-up listener", timeout=60)
        job = enqueue("tests.noop", {})
        wait_until(
            lambda: Job.objects.get(id=job.id).status == Job.Status.COMPLETED,
            "the job run by the cluster",
            timeout=60,
        )
        # Well before the minute schedule (an hour away now) could; 20 s for a busy machine.
        wait_until(lambda: _pending() == 0, "its deltas rolled up", timeout=20)
        assert cluster.poll() is None, log.read_text()
    finally:
        stop_process_group(cluster)
    assert job_status_counts()["completed"] == 1
