"""Issue 20, point 6: each attempt of a job is recorded (process, start, end, outcome,
error) in the transaction of the claim and of whatever ends it; paused kinds are not claimed.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import enqueue
from jobs.models import Job, JobAttempt, PausedKind
from jobs.outcomes import job_release
from jobs.reaper import jobs_reap_stale
from jobs.runner import run_pending
from jobs.runner_step import job_claim_batch

pytestmark = pytest.mark.django_db


def _attempts(job: Job) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job_id=job.pk).order_by("number"))


def test_a_failed_then_completed_job_has_two_attempts_with_process_times_and_error():
    job = enqueue("tests.scripted", {"outcome": "error", "n": 1}, max_attempts=3)
    first = run_pending()
    Job.objects.filter(pk=job.pk).update(
        payload={"outcome": "ok", "n": 2}, run_after=timezone.now()
    )
    second = run_pending()

    failed, completed = _attempts(job)
    assert (failed.number, failed.outcome, failed.worker) == (1, "retried", first.worker)
    assert failed.error.startswith("ValueError: scripted failure")
    assert failed.error_head == "ValueError: scripted failure"
    assert (completed.number, completed.outcome) == (2, "completed")
    assert completed.worker == second.worker
    assert completed.error == ""
    assert completed.worker.startswith(f"{socket.gethostname()}:")
    for attempt in (failed, completed):
        assert attempt.started_at <= attempt.finished_at
        assert attempt.duration_seconds >= 0


def test_a_reaped_attempt_ends_with_the_reapers_reason():
    job = enqueue("tests.noop", max_attempts=1)
    job_claim_batch(worker="host-dead:77:abcd", limit=1)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    assert [r.id for r in jobs_reap_stale()] == [job.pk]

    (attempt,) = _attempts(job)
    assert (attempt.outcome, attempt.worker) == ("failed", "host-dead:77:abcd")
    assert "reaped at" in attempt.error
    assert "host-dead:77:abcd stopped heartbeating" in attempt.error


def test_a_claim_given_back_unstarted_is_marked_released():
    job = enqueue("tests.noop")
    job_claim_batch(worker="w:1:x", limit=1)
    assert job_release(worker="w:1:x", job_ids=[job.pk]) == 1
    (attempt,) = _attempts(job)
    assert attempt.outcome == "released"


def test_deleting_a_job_deletes_its_history():
    job = enqueue("tests.noop")
    run_pending()
    assert len(_attempts(job)) == 1
    Job.objects.filter(pk=job.pk).delete()
    assert not JobAttempt.objects.filter(job_id=job.pk).exists()


def test_a_paused_kind_is_not_claimed_until_resumed():
    paused = enqueue("tests.noop")
    other = enqueue("tests.scripted", {"outcome": "ok", "n": 3})
    PausedKind.objects.create(kind="tests.noop")

    assert run_pending().claimed == 1
    paused.refresh_from_db()
    other.refresh_from_db()
    assert (paused.status, other.status) == ("queued", "completed")

    PausedKind.objects.filter(kind="tests.noop").delete()
    assert run_pending().completed == 1
    paused.refresh_from_db()
    assert paused.status == "completed"
