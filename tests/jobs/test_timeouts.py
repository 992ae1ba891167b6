"""Issue 37, points 6 and 7: `@handler(kind, timeout=seconds)` (JOBS_DEFAULT_TIMEOUT_SECONDS
otherwise), the job context's `deadline` and `stop_requested`. Real threads and a real event
loop in this process; the interleavings are forced with Events (tests/jobs/stop_handlers.py).
A handler that never returns retires its process: tests/jobs/test_stop_processes.py."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

import tests.jobs.stop_handlers  # noqa: F401 - registers the handlers below
from jobs import enqueue, handler, run_pending
from jobs.models import Job, JobAttempt
from jobs.reaper import jobs_reap_stale
from jobs.registry import check_timeouts
from tests.jobs.stop_handlers import GATES, SEEN
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slots(settings):
    """Thread slots and the event loop (JOBS_CONCURRENCY=4); every gate opened at the end so
    no handler thread outlives its test."""
    settings.JOBS_CONCURRENCY = 4
    settings.JOBS_STOP_GRACE_SECONDS = 30
    settings.JOBS_LINGER_SECONDS = 0
    GATES.clear()
    SEEN.clear()
    yield settings
    for gate in list(GATES.values()):
        gate.set()


def _logged(caplog, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


def test_an_async_handler_past_its_timeout_is_cancelled_and_retried_with_the_reason(slots):
    job = enqueue("tests.stop.async_sleeps", {"name": "a"}, max_attempts=3)

    summary = run_pending()

    assert SEEN["a.cancelled"] is True  # the task was cancelled (CancelledError at its await)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.locked_by) == (Job.Status.QUEUED, 1, "")
    assert "timed out after 0.5 s" in job.last_error
    attempt = JobAttempt.objects.get(job_id=job.pk)
    assert attempt.outcome == JobAttempt.Outcome.RETRIED
    assert "timed out after 0.5 s" in attempt.error
    assert (summary.timed_out, summary.retried, summary.completed) == (1, 1, 0)


def test_the_last_attempt_timed_out_fails_the_job():
    job = enqueue("tests.stop.async_sleeps", {"name": "last"}, max_attempts=1)

    run_pending()

    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "timed out after 0.5 s" in job.last_error


def test_a_thread_handler_is_asked_to_stop_and_its_job_stays_processing_until_it_returns(
    slots,
):
    """I21: a thread cannot be killed; until its handler returns the job stays `processing`,
    its lease renewed, and only then is the timeout recorded. Meanwhile the other slots go on."""
    slots.JOBS_LEASE_SECONDS = 2
    slots.JOBS_HEARTBEAT_SECONDS = 0.2
    job = enqueue("tests.stop.thread_polite", {"name": "t"}, max_attempts=3)
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["t.started"].wait(20)
        wait_until(lambda: SEEN.get("t.asked") is True, "the handler asked to stop", timeout=20)
        lease = Job.objects.get(pk=job.pk).lease_expires_at
        other = enqueue("tests.stop.quick", {"name": "q"})
        assert GATES["q.ran"].wait(20)  # an unrelated job runs meanwhile
        wait_until(
            lambda: Job.objects.get(pk=job.pk).lease_expires_at > lease,
            "the lease renewed while the handler still runs",
            timeout=20,
        )
        row = Job.objects.get(pk=job.pk)
        assert row.status == Job.Status.PROCESSING and row.last_error == ""
        wait_until(
            lambda: Job.objects.get(pk=other.pk).status == Job.Status.COMPLETED,
            "the unrelated job completed",
            timeout=20,
        )
    finally:
        GATES["t.hold"].set()
        thread.join(60)
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED
    assert "timed out after 0.5 s" in job.last_error
    # The job context said when it had to return.
    assert SEEN["t.deadline"] - SEEN["t.started_at"] == timedelta(seconds=0.5)
    assert result["summary"].timed_out == 1


def test_an_async_handler_blocking_the_event_loop_is_timed_out_when_it_yields(slots, caplog):
    """A synchronous call inside an `async def` holds the loop: the cancel lands at its next
    await. Thread slots go on meanwhile; the loop's other task completes once it is free."""
    caplog.set_level(logging.INFO, logger="jobs")
    blocker = enqueue("tests.stop.async_blocks_loop", {"name": "b"}, priority=10)
    waiting = enqueue("tests.stop.async_other", {"name": "o"}, priority=5)
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["b.started"].wait(20)
        threaded = enqueue("tests.stop.quick", {"name": "q"})
        assert GATES["q.ran"].wait(20)  # a thread slot runs while the loop is blocked
        wait_until(lambda: _logged(caplog, "job_timed_out"), "the blocker asked to stop")
        assert not GATES["o.ran"].is_set()  # the loop is still held
    finally:
        GATES["b.release"].set()
        thread.join(60)
    for job in (blocker, waiting, threaded):
        job.refresh_from_db()
    assert blocker.status == Job.Status.QUEUED
    assert "timed out after 0.3 s" in blocker.last_error
    assert (waiting.status, threaded.status) == (Job.Status.COMPLETED, Job.Status.COMPLETED)


def test_an_async_handler_swallowing_cancellation_retires_the_drain_not_the_other_jobs(
    slots, caplog
):
    """It catches every CancelledError and goes on: after JOBS_STOP_GRACE_SECONDS the drain
    stops claiming, lets its other slots finish, leaves the job `processing` with a lease that
    runs out, and says its process must be replaced. Only once that process is gone does the
    reaper re-queue it, with the timeout in its attempt history."""
    caplog.set_level(logging.INFO, logger="jobs")
    slots.JOBS_STOP_GRACE_SECONDS = 0.5
    hung = enqueue("tests.stop.async_swallows", {"name": "s"}, priority=10, max_attempts=3)
    busy = enqueue("tests.stop.gated", {"name": "g"}, priority=5)
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["s.started"].wait(20) and GATES["g.started"].wait(20)
        wait_until(lambda: _logged(caplog, "job_handler_hung"), "the handler given up on")
        assert SEEN["s.swallowed"] >= 1
        late = enqueue("tests.stop.quick", {"name": "late"})
        GATES["g.release"].set()  # the other slot finishes after the hang was seen
        thread.join(60)
        assert not thread.is_alive()
    finally:
        GATES["s.release"].set()
    summary = result["summary"]
    assert summary.retire and summary.hung == [hung.pk]
    late.refresh_from_db()
    assert (late.status, late.attempts) == (Job.Status.QUEUED, 0)  # never claimed
    busy.refresh_from_db()
    assert busy.status == Job.Status.COMPLETED
    hung.refresh_from_db()
    assert hung.status == Job.Status.PROCESSING  # its handler may still run: not re-queued
    assert hung.lease_expires_at is not None
    assert hung.lease_expires_at <= timezone.now() + timedelta(seconds=5)
    wait_until(lambda: timezone.now() > hung.lease_expires_at, "the lease run out", timeout=10)
    jobs_reap_stale()
    hung.refresh_from_db()
    assert hung.status == Job.Status.QUEUED
    attempt = JobAttempt.objects.get(job_id=hung.pk)
    assert attempt.outcome == JobAttempt.Outcome.RETRIED
    assert "timed out after 0.3 s" in attempt.error


def test_a_timeout_that_cannot_fit_inside_q_timeout_is_refused_naming_the_kind(settings):
    """django-q2 kills a task past Q_TIMEOUT: a drain (JOBS_DRAIN_SECONDS) may start a job
    at its end, which may then run its timeout and the grace. Refused at registration and
    at start-up (run_jobs, qcluster), naming the kind."""
    with pytest.raises(ImproperlyConfigured, match="tests.stop.too_long"):
        handler("tests.stop.too_long", timeout=10_000)(lambda payload: None)
    for bad in (0, -1, True, "5", float("nan")):
        with pytest.raises(ImproperlyConfigured, match="timeout"):
            handler("tests.stop.bad_timeout", timeout=bad)(lambda payload: None)

    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 100}
    settings.JOBS_DRAIN_SECONDS = 60
    settings.JOBS_STOP_GRACE_SECONDS = 10
    settings.JOBS_DEFAULT_TIMEOUT_SECONDS = 20
    with pytest.raises(ImproperlyConfigured, match=r"tests\.stop\.async_polite.*Q_TIMEOUT"):
        check_timeouts()
    settings.JOBS_DEFAULT_TIMEOUT_SECONDS = 60
    with pytest.raises(ImproperlyConfigured, match="JOBS_DEFAULT_TIMEOUT_SECONDS"):
        check_timeouts()


def test_an_event_loop_blocked_past_the_grace_retires_the_drain_naming_the_cause(slots, caplog):
    """An `async def` handler blocks the loop and never yields: no cancel can land, and the
    loop's other tasks cannot run either. The drain does not wait out their own timeouts:
    once the loop has not run for JOBS_STOP_GRACE_SECONDS after the blocker was asked to
    stop, it stops claiming, lets its thread slots finish and retires; the other async job
    is left to the reaper saying the loop was blocked (not that it timed out)."""
    caplog.set_level(logging.INFO, logger="jobs")
    slots.JOBS_STOP_GRACE_SECONDS = 0.5
    blocker = enqueue("tests.stop.async_blocks_loop", {"name": "b"}, priority=10)
    other = enqueue("tests.stop.async_polite", {"name": "x"}, priority=5)  # timeout 30 s
    threaded = enqueue("tests.stop.gated", {"name": "g"}, priority=1)
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["b.started"].wait(20) and GATES["g.started"].wait(20)
        wait_until(lambda: _logged(caplog, "jobs_event_loop_blocked"), "the blocked loop seen")
        GATES["g.release"].set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        GATES["b.release"].set()
    summary = result["summary"]
    assert summary.retire and sorted(summary.hung) == sorted([blocker.pk, other.pk])
    threaded.refresh_from_db()
    assert threaded.status == Job.Status.COMPLETED
    blocker.refresh_from_db()
    other.refresh_from_db()
    assert (blocker.status, other.status) == (Job.Status.PROCESSING, Job.Status.PROCESSING)
    assert "timed out after 0.3 s" in blocker.last_error
    assert "event loop was blocked" in other.last_error
    assert "timed out" not in other.last_error
