"""Issue 38, point 2: a handler raises `jobs.Snooze(seconds)`; the job goes back to `queued`
due in that many seconds without spending an attempt, its history says "snoozed", and after
JOBS_MAX_SNOOZES snoozes it fails with that reason. Hostile snoozes (point 9) are a clear
error at construction, recorded as the attempt's failure, nothing half-written.

Real PostgreSQL, real drains (the one-slot drain and the slots), no mocking.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

import jobs
from jobs import Snooze, enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.operator_actions import jobs_retry_now

User = get_user_model()
pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ["tests.snooze", "tests.snooze_own_steps", "tests.snooze_async"]


def _db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _due_now(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(run_after=_db_now() - timedelta(seconds=1))


def _history(job: Job) -> list[tuple[int, str]]:
    return list(
        JobAttempt.objects.filter(job_id=job.pk).order_by("id").values_list("number", "outcome")
    )


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_a_snoozed_job_is_queued_again_due_in_that_many_seconds_without_spending_an_attempt(
    kind, concurrency, settings, tmp_path
):
    settings.JOBS_CONCURRENCY = concurrency
    log = str(tmp_path / "starts.log")
    job = enqueue(kind, {"log": log, "seconds": 30, "times": 1}, max_attempts=1)
    before = _db_now()

    summary = run_pending()

    after = _db_now()
    job.refresh_from_db()
    assert (summary.claimed, summary.snoozed, summary.retried, summary.failed) == (1, 1, 0, 0)
    assert summary.errors == []
    assert job.status == Job.Status.QUEUED
    assert job.attempts == 0  # max_attempts=1: the one real attempt is still there
    assert job.snoozes == 1
    assert before + timedelta(seconds=30) <= job.run_after <= after + timedelta(seconds=30)
    assert job.locked_by == "" and job.lease_expires_at is None and job.failed_at is None
    assert "snoozed for 30 s" in job.last_error
    [attempt] = JobAttempt.objects.filter(job_id=job.pk)
    assert (attempt.number, attempt.outcome) == (1, "snoozed")
    assert "snoozed for 30 s" in attempt.error and attempt.finished_at is not None
    if kind == "tests.snooze":  # an atomic handler's transaction is rolled back on Snooze
        assert not User.objects.filter(username__startswith="snoozer-").exists()

    _due_now(job)
    summary = run_pending()

    job.refresh_from_db()
    assert (summary.claimed, summary.completed, summary.snoozed) == (1, 1, 0)
    assert (job.status, job.attempts, job.snoozes) == (Job.Status.COMPLETED, 1, 1)
    assert _history(job) == [(1, "snoozed"), (1, "completed")]


def test_a_job_that_keeps_snoozing_fails_after_jobs_max_snoozes_with_that_reason(
    settings, tmp_path
):
    settings.JOBS_MAX_SNOOZES = 3
    log = str(tmp_path / "starts.log")
    job = enqueue("tests.snooze", {"log": log, "seconds": 0, "times": 1000}, max_attempts=2)

    summaries = [run_pending() for _ in range(6)]

    job.refresh_from_db()
    assert sum(s.snoozed for s in summaries) == 3
    assert sum(s.failed for s in summaries) == 1
    assert job.status == Job.Status.FAILED and job.failed_at is not None
    assert job.snoozes == 3 and job.attempts == 1
    assert "snoozed 3 times" in job.last_error and "JOBS_MAX_SNOOZES=3" in job.last_error
    assert _history(job) == [(1, "snoozed")] * 3 + [(1, "failed")]
    assert len(open(log).read().splitlines()) == 4  # ran 4 times, no more

    # Retry now gives it its snoozes back, as it gives a failed job one more attempt.
    assert jobs_retry_now(jobs=Job.objects.filter(pk=job.pk)) == 1
    job.refresh_from_db()
    assert (job.status, job.snoozes) == (Job.Status.QUEUED, 0)


def test_jobs_max_snoozes_of_zero_fails_the_first_snooze(settings, tmp_path, caplog):
    settings.JOBS_MAX_SNOOZES = 0
    job = enqueue("tests.snooze", {"log": str(tmp_path / "l"), "seconds": 5}, max_attempts=3)

    with caplog.at_level(logging.INFO, logger="jobs.completer"):
        summary = run_pending()

    job.refresh_from_db()
    assert (summary.failed, summary.snoozed) == (1, 0)
    assert job.status == Job.Status.FAILED and "JOBS_MAX_SNOOZES=0" in job.last_error
    # The drain's summary and its log line give the reason, not "snoozed for 5 s".
    [error] = summary.errors
    assert "JOBS_MAX_SNOOZES=0" in error
    failed = [r for r in caplog.records if getattr(r, "action", "") == "job_failed"]
    assert len(failed) == 1 and "JOBS_MAX_SNOOZES=0" in failed[0].getMessage()


def test_a_snooze_is_logged_as_a_snooze_not_an_error(tmp_path, caplog):
    enqueue("tests.snooze", {"log": str(tmp_path / "l"), "seconds": 7}, max_attempts=3)

    with caplog.at_level(logging.INFO, logger="jobs.completer"):
        run_pending()

    [line] = [r for r in caplog.records if getattr(r, "action", "") == "job_snoozed"]
    assert line.levelno == logging.INFO and "snoozed for 7 s" in line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_snooze_does_not_wipe_the_attempts_already_spent(tmp_path):
    """A job that failed once then snoozes keeps its one failed attempt."""
    job = enqueue("tests.snooze", {"log": str(tmp_path / "l"), "seconds": 60}, max_attempts=3)
    Job.objects.filter(pk=job.pk).update(attempts=1)

    run_pending()

    job.refresh_from_db()
    assert (job.status, job.attempts, job.snoozes) == (Job.Status.QUEUED, 1, 1)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (-5, ValueError, "between 0 and"),
        (-0.001, ValueError, "between 0 and"),
        (10 * 365 * 86400, ValueError, "between 0 and"),
        (timedelta(days=3650), ValueError, "between 0 and"),
        (float("nan"), ValueError, "finite"),
        (float("inf"), ValueError, "finite"),
        ("30", TypeError, "number of seconds"),
        (None, TypeError, "number of seconds"),
        (True, TypeError, "number of seconds"),
        ([30], TypeError, "number of seconds"),
    ],
)
def test_a_hostile_snooze_is_refused_at_construction(value, error, words):
    with pytest.raises(error, match=words):
        Snooze(value)


def test_a_snooze_takes_seconds_or_a_timedelta():
    assert Snooze(30).seconds == 30.0
    assert Snooze(0).seconds == 0.0
    assert Snooze(1.5).seconds == 1.5
    assert Snooze(timedelta(minutes=2)).seconds == 120.0
    assert math.isclose(Snooze(30 * 86400).seconds, 30 * 86400)
    assert jobs.Snooze is Snooze and "Snooze" in jobs.__all__


@pytest.mark.parametrize(
    ("raw", "words"),
    [(-5, "ValueError"), ("ten years", "ValueError"), ("nan", "ValueError"), ("30", "TypeError")],
)
def test_a_hostile_snooze_in_a_handler_is_the_attempts_failure_nothing_half_written(
    raw, words, settings, tmp_path
):
    job = enqueue("tests.snooze", {"log": str(tmp_path / "l"), "raw": raw}, max_attempts=3)
    before = _db_now()

    summary = run_pending()

    job.refresh_from_db()
    assert (summary.retried, summary.snoozed) == (1, 0)
    assert job.status == Job.Status.QUEUED and job.attempts == 1 and job.snoozes == 0
    assert job.last_error.startswith(words) and "Snooze" in job.last_error
    assert job.run_after >= before + timedelta(seconds=settings.JOBS_BACKOFF_BASE_SECONDS)
    assert _history(job) == [(1, "retried")]
    assert not User.objects.filter(username__startswith="snoozer-").exists()


def test_a_snooze_record_for_a_row_no_longer_ours_changes_nothing(tmp_path):
    """The reaper took the row while the handler ran: the snooze is 'lost', the reaper's
    state stays."""
    from jobs.outcomes import job_record_failure
    from jobs.runner_step import job_claim_batch

    job = enqueue("tests.snooze", {"log": str(tmp_path / "l")}, max_attempts=3)
    [claimed] = job_claim_batch(worker="w1", limit=1)
    Job.objects.filter(pk=job.pk).update(locked_by="w2")

    assert job_record_failure(job=claimed, worker="w1", exc=Snooze(10)) == "lost"

    job.refresh_from_db()
    assert (job.status, job.attempts, job.snoozes) == (Job.Status.PROCESSING, 1, 0)


@pytest.mark.slow
@pytest.mark.serial
def test_a_real_qcluster_starts_a_snoozed_job_within_a_second_of_its_due_time(worker_env, tmp_path):
    """The snooze's UPDATE makes the row due later: the table's trigger NOTIFYs that due
    time (within the trigger's 60 s horizon; beyond it the listener's look-ahead finds it),
    the listener arms a timer and wakes a worker then. 3 s and 5 s: past the drains' 2 s
    linger, so no lingering drain is what starts them; full scans 30 s apart."""
    from tests.jobs.test_start_within_a_second import GUARANTEE_SECONDS, _cluster_env
    from tests.jobs.test_wakeup import _qcluster

    env = _cluster_env(worker_env, JOBS_CLAIM_FULL_SCAN_SECONDS="30")
    with _qcluster(env, tmp_path / "qcluster.log"):
        snoozers = [
            enqueue("tests.snooze", {"log": str(tmp_path / f"{s}.log"), "seconds": s})
            for s in (3, 5)
        ]
        deadline = _db_now() + timedelta(seconds=60)
        while Job.objects.filter(
            pk__in=[j.pk for j in snoozers], status__in=["queued", "processing"]
        ).exists():
            assert _db_now() < deadline, (tmp_path / "qcluster.log").read_text()[-4000:]
            time.sleep(0.1)
    waits = {}
    for job in snoozers:
        job.refresh_from_db()
        assert (job.status, job.snoozes, job.attempts) == (Job.Status.COMPLETED, 1, 1)
        waits[job.pk] = (job.started_at - job.run_after).total_seconds()
    print("snoozed job's due time to its start:", waits)
    assert all(0 <= wait <= GUARANTEE_SECONDS for wait in waits.values()), waits
