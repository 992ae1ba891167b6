"""The job loop (jobs/runner.py) under faults: handlers that raise a BaseException, and
database connections that die under the drain and under its heartbeat (issue 11)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from jobs import enqueue, run_pending
from jobs.models import Job
from jobs.reaper import jobs_reap_stale
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

User = get_user_model()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("raised", "error"),
    [
        ("CancelledError", "asyncio.exceptions.CancelledError: cancelled by the handler"),
        ("GeneratorExit", "GeneratorExit: generator closed"),
        ("HandlerAbort", "tests.jobs.handlers.HandlerAbort: custom abort"),
    ],
)
def test_a_handlers_base_exception_is_a_failure_with_backoff_and_the_drain_goes_on(raised, error):
    """Item 3: a BaseException that is not an interrupt used to escape the loop (killing the
    worker process) and re-queue the job with no delay, so a poisoned handler spun. It is
    the job's failure: rolled back, recorded with the backoff, and the drain carries on."""
    failing = enqueue("tests.base_exception", {"username": "base", "raise": raised}, priority=10)
    after = enqueue("tests.create_user", {"username": "after"})
    before = timezone.now()

    summary = run_pending()  # does not raise

    assert (summary.claimed, summary.retried, summary.completed) == (2, 1, 1)
    failing.refresh_from_db()
    assert failing.status == Job.Status.QUEUED
    assert failing.attempts == 1
    assert failing.last_error.splitlines()[0] == error
    assert failing.run_after >= before + timedelta(seconds=settings.JOBS_BACKOFF_BASE_SECONDS)
    assert failing.locked_by == "" and failing.completed_at is None
    assert not User.objects.filter(username="base").exists()  # rolled back
    after.refresh_from_db()
    assert after.status == Job.Status.COMPLETED


@pytest.mark.usefixtures("one_slot")
@pytest.mark.django_db(transaction=True)
def test_system_exit_is_recorded_then_reraised_and_the_batch_given_back():
    """SystemExit (like KeyboardInterrupt) means the process is stopping: recorded first,
    then re-raised; the unstarted claims of the batch are released."""
    stopping = enqueue("tests.base_exception", {"username": "x", "raise": "SystemExit"}, priority=5)
    waiting = enqueue("tests.noop")

    with pytest.raises(SystemExit):
        run_pending()

    stopping.refresh_from_db()
    assert (stopping.status, stopping.attempts) == (Job.Status.QUEUED, 1)
    assert stopping.last_error.startswith("SystemExit: 3")
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts, waiting.locked_by) == (Job.Status.QUEUED, 0, "")


def _terminate_heartbeat_backends() -> int:
    """End the connection that renews leases (its last statement was the heartbeat UPDATE)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND query LIKE %s",
            ['UPDATE "jobs_job" SET "heartbeat_at"%'],
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_d4_heartbeat_reconnects_so_a_live_job_is_never_reaped(settings, tmp_path):
    """D4: after one dropped connection the heartbeat thread logged an error every beat and
    never reconnected; the lease ran out and the reaper took the LIVE job (its effects then
    happened twice). The heartbeat must reconnect and keep the lease."""
    settings.JOBS_HEARTBEAT_SECONDS = 0.2
    settings.JOBS_LEASE_SECONDS = 1.5
    block, log = tmp_path / "block", tmp_path / "runs.log"
    block.touch()
    job = enqueue("tests.blocking", {"log": str(log), "block": str(block), "n": 1})
    result: dict = {}
    runner = drain_in_thread(result)
    try:
        wait_until(lambda: log.exists() and "start" in log.read_text(), "the job to start")
        wait_until(lambda: _terminate_heartbeat_backends() > 0, "the heartbeat's connection")
        # Long past the lease if nobody renews: wait for a beat written three leases after
        # the kill rather than sleeping that long, so the reaper below looks right after a
        # beat. A fixed sleep let a loaded machine that delayed one beat by more than the
        # 1.5 s lease fail the test with no defect; without a reconnect no such beat comes.
        past_the_lease = timezone.now() + timedelta(seconds=3 * settings.JOBS_LEASE_SECONDS)
        wait_until(
            lambda: Job.objects.get(pk=job.pk).heartbeat_at > past_the_lease,
            "a heartbeat three leases after its connection was killed",
        )

        assert jobs_reap_stale() == [], "a live job was reaped"
        job.refresh_from_db()
        assert job.status == Job.Status.PROCESSING
        assert job.lease_expires_at > timezone.now()
    finally:
        block.unlink()
        runner.join(timeout=30)

    assert result["summary"].completed == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.COMPLETED, 1)
    assert log.read_text().count("done") == 1  # the effect happened once


@pytest.mark.django_db(transaction=True)
def test_d3_a_drain_whose_connection_dies_reconnects_and_runs_the_rest(settings):
    """D3, the drain inside the qcluster task: the connection dies between two claims. The
    drain used to end with `OperationalError: terminating connection`, leaving the rest of
    the queue to the next wake-up; it now reconnects (after a logged backoff) and goes on."""
    from jobs.tasks import run_due_jobs

    first = enqueue("tests.lose_connection_after_commit", {"username": "first"}, priority=10)
    second = enqueue("tests.create_user", {"username": "second"})
    settings.JOBS_CLAIM_BATCH_SIZE = 1  # the second job needs a claim of its own

    result = run_due_jobs()

    assert (result["claimed"], result["completed"]) == (2, 2)
    for job in (first, second):
        job.refresh_from_db()
        assert (job.status, job.attempts) == (Job.Status.COMPLETED, 1)
    assert set(User.objects.values_list("username", flat=True)) == {"first", "second"}
