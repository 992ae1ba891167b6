"""`manage.py run_jobs` (the loop mode) against lost database connections (issue 11, D3)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from jobs import enqueue
from jobs.models import Job
from tests.support.processes import spawn_manage_py, terminate_backends, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

APP_NAME = "test-run-jobs-loop"


def _completed(job: Job) -> bool:
    job.refresh_from_db()
    return job.status == Job.Status.COMPLETED


def test_d3_run_jobs_survives_terminated_backends_and_stops_on_sigterm(worker_env):
    """D3: after `pg_terminate_backend` the loop exited with `OperationalError: terminating
    connection`. It must reconnect (with a logged backoff), run a job enqueued afterwards,
    and still stop cleanly on SIGTERM."""
    env = {**worker_env, "PGAPPNAME": APP_NAME, "JOBS_POLL_SECONDS": "0.2"}
    worker = spawn_manage_py("run_jobs", env=env, stderr=subprocess.STDOUT)
    try:
        before = enqueue("tests.create_user", {"username": "before"})
        wait_until(lambda: _completed(before), "the job enqueued before the fault", timeout=60)

        for _ in range(3):  # more than once: each loss is survived, not just the first
            wait_until(lambda: terminate_backends(APP_NAME) > 0, "the worker's connection")
        after = enqueue("tests.create_user", {"username": "after"})
        wait_until(lambda: _completed(after), "the job enqueued after the fault", timeout=60)
        assert worker.poll() is None, "the loop exited"
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)

    assert worker.returncode == 0, output
    assert "SIGTERM: stopped" in output
    assert "database connection lost" in output  # logged, with the backoff
    assert Job.objects.get(pk=after.pk).attempts == 1
