"""The job loop in this process: success, failure path (COR-17, I3), attempts (I5)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from model_bakery import baker

from jobs import enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.operator_actions import jobs_cancel

User = get_user_model()


@pytest.mark.django_db(transaction=True)
def test_database_error_in_handler_is_rolled_back_then_recorded():
    """COR-17: a handler whose failure is a database error (IntegrityError in its own
    transaction). The old worker committed the failure on the aborted transaction, which
    raised InFailedSqlTransaction and left the row `processing`. Here the runner rolls back
    first, records in a fresh transaction, and does not raise."""
    job = enqueue("tests.integrity_error", {"username": "dup"})
    before = timezone.now()

    summary = run_pending()

    assert (summary.claimed, summary.retried, summary.completed, summary.failed) == (1, 1, 0, 0)
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED
    assert job.attempts == 1
    assert "IntegrityError" in job.last_error.splitlines()[0]
    assert job.run_after >= before + timedelta(seconds=settings.JOBS_BACKOFF_BASE_SECONDS)
    assert job.locked_by == "" and job.lease_expires_at is None
    assert job.completed_at is None and job.failed_at is None
    # The handler's first insert was rolled back with its transaction.
    assert not User.objects.filter(username="dup").exists()


@pytest.mark.django_db(transaction=True)
def test_handler_registered_outside_a_transaction_keeps_its_own_commits_when_it_raises():
    """A handler with an external effect (a Slack post) registered with atomic=False runs
    outside the job's transaction: what it committed before the effect stands although it
    raises afterwards, and the failure is still recorded and retried."""
    job = enqueue("tests.commits_then_fails", {"username": "claimed"})

    summary = run_pending()

    assert (summary.claimed, summary.retried, summary.completed) == (1, 1, 0)
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and "external call failed" in job.last_error
    claimed = User.objects.get(username="claimed")
    assert claimed.last_name == "False"  # its own atomic block was the outermost: committed


@pytest.mark.django_db
def test_success_commits_handler_work_and_completion_together():
    job = enqueue("tests.create_user", {"username": "alice"})

    summary = run_pending()

    assert (summary.claimed, summary.completed) == (1, 1)
    job.refresh_from_db()
    assert job.status == Job.Status.COMPLETED
    assert job.completed_at is not None and job.failed_at is None
    assert job.attempts == 1 and job.locked_by == ""
    assert User.objects.filter(username="alice").exists()


@pytest.mark.usefixtures("one_slot")
@pytest.mark.django_db(transaction=True)
def test_jobs_that_write_nothing_cost_one_statement_per_batch():
    """Issue 22, point 5: a claim per job and a completion per job, each a round trip,
    capped the runner near a bare one-row loop. Handlers that wrote nothing in their
    transaction have nothing to commit with their completion, so the completions of a batch
    go with the next claim: five no-op jobs cost two statements (claim five; complete five
    and find nothing more), each committed alone, and every row gets its handler's start."""
    jobs = [enqueue("tests.noop", {"n": n}) for n in range(5)]
    in_transaction: list[bool] = []

    def record(execute, sql, params, many, context):
        in_transaction.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        summary = run_pending()

    assert (summary.claimed, summary.completed, summary.lost) == (5, 5, 0)
    assert len(in_transaction) == 2, in_transaction
    assert not any(in_transaction)  # each statement its own transaction
    starts = []
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.locked_by) == (Job.Status.COMPLETED, 1, "")
        assert job.started_at is not None and job.completed_at >= job.started_at
        starts.append(job.started_at)
    assert starts == sorted(starts)  # started one after another, in claim order
    assert JobAttempt.objects.filter(outcome="completed").count() == 5


@pytest.mark.django_db
def test_last_attempt_fails_the_job_with_failed_at_and_no_completed_at():
    job = enqueue("tests.boom", {"message": "still broken"}, max_attempts=3)

    for attempt in range(1, 4):
        Job.objects.filter(pk=job.pk).update(run_after=timezone.now())  # skip the backoff
        summary = run_pending()
        assert summary.claimed == 1
        job.refresh_from_db()
        assert job.attempts == attempt

    assert job.status == Job.Status.FAILED
    assert job.failed_at is not None
    assert job.completed_at is None
    assert job.last_error.startswith("RuntimeError: still broken")
    assert "Traceback" in job.last_error

    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert run_pending().claimed == 0  # never claimed again, never above max_attempts
    job.refresh_from_db()
    assert job.attempts == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        ("tests.permanent", {}, "PermanentJobError: this can never work"),
        ("tests.needs_user_id", {"user_id": "seven"}, "InvalidPayload: user_id must be"),
        ("tests.no_such_kind", {}, "UnknownJobKind: no handler registered for job kind"),
    ],
)
def test_permanent_errors_fail_at_once_without_retrying(kind, payload, message):
    job = enqueue(kind, payload, max_attempts=5)

    summary = run_pending()

    assert (summary.failed, summary.retried) == (1, 0)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.attempts == 1
    assert message in job.last_error.splitlines()[0]
    assert job.failed_at is not None and job.completed_at is None


@pytest.mark.usefixtures("one_slot")
@pytest.mark.django_db(transaction=True)
def test_keyboard_interrupt_is_recorded_then_reraised_and_unstarted_claims_released():
    interrupted = enqueue("tests.interrupt", {"username": "int"}, priority=10)
    waiting = [enqueue("tests.noop") for _ in range(3)]

    with pytest.raises(KeyboardInterrupt):
        run_pending()

    interrupted.refresh_from_db()
    assert interrupted.status == Job.Status.QUEUED
    assert interrupted.attempts == 1
    assert interrupted.last_error.startswith("KeyboardInterrupt")
    assert interrupted.run_after <= timezone.now()  # a stop is not the job's fault: no backoff
    assert not User.objects.filter(username="int").exists()
    for job in waiting:  # claimed in the same batch, never started: attempt given back
        job.refresh_from_db()
        assert (job.status, job.attempts, job.locked_by) == (Job.Status.QUEUED, 0, "")

    assert jobs_cancel(jobs=Job.objects.filter(pk=interrupted.pk)) == 1
    assert run_pending().completed == 3


@pytest.mark.django_db(transaction=True)
def test_completion_after_a_reap_does_not_overwrite_the_reaped_row():
    """The reaper reclaims the row while the handler runs: the late completion finds it no
    longer owned, changes nothing, and the handler's writes roll back with it."""
    job = enqueue("tests.reaped_midway", {"username": "late"})

    summary = run_pending()

    assert (summary.lost, summary.completed) == (1, 0)
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED
    assert job.completed_at is None
    assert job.last_error.startswith("reaped at")
    assert not User.objects.filter(username="late").exists()


@pytest.mark.django_db
def test_claims_honour_priority_run_after_and_limit():
    now = timezone.now()
    low = baker.make(Job, kind="tests.noop", max_attempts=3, priority=0, run_after=now)
    high = baker.make(Job, kind="tests.noop", max_attempts=3, priority=5, run_after=now)
    later = baker.make(Job, kind="tests.noop", max_attempts=3, run_after=now + timedelta(hours=1))

    assert run_pending(limit=1).completed == 1
    high.refresh_from_db()
    low.refresh_from_db()
    assert high.status == Job.Status.COMPLETED and low.status == Job.Status.QUEUED

    assert run_pending().completed == 1
    later.refresh_from_db()
    assert later.status == Job.Status.QUEUED and later.attempts == 0


@pytest.mark.django_db
def test_failure_logs_redact_email_addresses_but_the_row_keeps_the_detail(caplog):
    job = enqueue("tests.boom", {"message": "bounced: pi.smith@uni.example.org"})

    summary = run_pending()

    assert "pi.smith@uni.example.org" not in caplog.text
    assert "bounced: p***@uni.example.org" in caplog.text
    assert summary.errors == [f"#{job.pk} tests.boom: RuntimeError: bounced: p***@uni.example.org"]
    job.refresh_from_db()
    assert "pi.smith@uni.example.org" in job.last_error  # operators see it in the admin


@pytest.mark.django_db
def test_drain_deadline_is_checked_before_each_job_and_unstarted_claims_are_given_back(
    settings, tmp_path
):
    """Review defect: `max_seconds` was checked only before claiming a batch, so a batch of
    slow handlers could run past django-q2's Q_TIMEOUT; the cluster then kills the drain
    and the unstarted claims are reaped later, each losing an attempt. Now the deadline is
    checked before every job and the unstarted claims are released with their attempt
    undone. Sleeps bound the count: a job starts only before the 1 s deadline, and each
    takes ≥ 0.6 s, so at most two of the four can run. (Inside this test's transaction no
    other worker could see the claims, so the runner's keeper does not give them back
    early, issue 22: the drain's end does.)"""
    from jobs.tasks import run_due_jobs

    settings.JOBS_DRAIN_SECONDS = 1.0
    log = tmp_path / "runs.log"
    before = timezone.now()
    jobs = [enqueue("tests.log", {"n": n, "log": str(log), "sleep": 0.6}) for n in range(4)]

    result = run_due_jobs()

    assert result["completed"] in (1, 2)
    assert result["claimed"] == 4
    assert result["released"] == 4 - result["completed"]
    assert result["budget_exhausted"] is True
    ran = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert len(ran) == result["completed"]  # released jobs never started
    for job in jobs:
        job.refresh_from_db()
        if job.payload["n"] in ran:
            assert (job.status, job.attempts) == (Job.Status.COMPLETED, 1)
        else:  # back in the queue as if never claimed: no attempt lost, due now, no owner
            assert (job.status, job.attempts, job.locked_by) == (Job.Status.QUEUED, 0, "")
            assert job.run_after <= before + timedelta(seconds=1)
            assert job.started_at is None and job.lease_expires_at is None

    settings.JOBS_DRAIN_SECONDS = 60
    assert run_due_jobs()["completed"] == 4 - len(ran)
    assert set(Job.objects.values_list("status", "attempts")) == {(Job.Status.COMPLETED, 1)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("tests.nul_in_error", "ValueError: unexpected byte \\x00 in the input"),
        ("tests.unprintable_error", "tests.jobs.handlers.UnprintableError: <str() failed"),
    ],
)
def test_an_error_whose_text_cannot_be_stored_is_still_recorded_and_the_drain_goes_on(kind, error):
    """A handler error quoting a NUL byte made recording the failure raise (PostgreSQL text
    cannot hold one), and an exception whose str() raised broke the runner's catch-all: the
    drain crashed, the row stayed `processing` until the reaper, and the rest of the batch
    was given back unrun."""
    bad = enqueue(kind, priority=1)
    good = enqueue("tests.noop")

    summary = run_pending()

    assert (summary.claimed, summary.retried, summary.completed) == (2, 1, 1)
    bad.refresh_from_db()
    assert bad.status == Job.Status.QUEUED and bad.attempts == 1
    assert bad.last_error.startswith(error)
    good.refresh_from_db()
    assert good.status == Job.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_the_runner_statement_commits_without_the_flush_only_as_a_transaction_of_its_own():
    """Issue 22, point 5: the runner's statement, run as a transaction of its own, commits
    without waiting for the WAL flush. Inside a caller's transaction (a handler's writes)
    it must not make the caller's commit asynchronous, and it never changes the session's
    setting."""
    from jobs.runner_step import job_runner_step

    first, second = enqueue("tests.noop"), enqueue("tests.noop")

    def synchronous_commit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            return cursor.fetchone()[0]

    with transaction.atomic():
        step = job_runner_step(worker="w", claim=1)
        assert synchronous_commit() == "on"
    assert [job.id for job in step.claimed] == [first.pk]

    step = job_runner_step(worker="w", done=[(first.pk, 0.01)], claim=5, want_more=True)
    assert step.completed == {first.pk} and [job.id for job in step.claimed] == [second.pk]
    assert not step.more_due
    assert synchronous_commit() == "on"
    first.refresh_from_db()
    assert first.status == Job.Status.COMPLETED
