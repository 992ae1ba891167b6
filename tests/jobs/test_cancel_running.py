"""Issue 37, point 8: the admin's *Cancel* and `jobs_cancel` on a `processing` job reach the
process holding it (its keeper asks the database for cancel requests of the jobs it runs,
every CANCEL_POLL_SECONDS): an async handler is cancelled, a thread handler asked to stop;
the job ends `cancelled` once its handler has stopped, its attempt recorded with the reason.
Real slots in this process; the interleavings forced with Events."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

import tests.jobs.stop_handlers  # noqa: F401 - registers the handlers below
from jobs import enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.operator_actions import jobs_cancel, jobs_retry_now
from jobs.reaper import jobs_reap_stale
from jobs.runner_step import job_claim_batch
from jobs.stops import STOP_CANCEL, job_record_stopped
from tests.jobs.stop_handlers import GATES, SEEN
from tests.jobs.test_admin import _confirm
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slots(settings):
    settings.JOBS_CONCURRENCY = 4
    settings.JOBS_LINGER_SECONDS = 0
    GATES.clear()
    SEEN.clear()
    yield settings
    for gate in list(GATES.values()):
        gate.set()


def _cancel(job: Job) -> int:
    return jobs_cancel(jobs=Job.objects.filter(pk=job.pk))


def _ends_cancelled(job: Job, reason: str = "cancelled while running") -> None:
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED and job.cancelled_at is not None
    assert job.locked_by == "" and job.lease_expires_at is None
    attempt = JobAttempt.objects.get(job_id=job.pk)
    assert attempt.outcome == JobAttempt.Outcome.CANCELLED
    assert reason in attempt.error and attempt.finished_at is not None


def test_cancelling_a_running_thread_handler_asks_it_to_stop_then_ends_cancelled(slots):
    job = enqueue("tests.stop.thread_waits", {"name": "t"})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["t.started"].wait(20)
        assert _cancel(job) == 1
        wait_until(lambda: SEEN.get("t.asked") is True, "the handler asked to stop", timeout=20)
        assert SEEN["t.reason"] == STOP_CANCEL
        # Its handler still runs (held by the test): the job is still its worker's.
        assert Job.objects.get(pk=job.pk).status == Job.Status.PROCESSING
    finally:
        GATES["t.hold"].set()
        thread.join(60)
    _ends_cancelled(job)
    assert result["summary"].cancelled == 1


def test_cancelling_a_running_atomic_handler_rolls_its_writes_back(slots):
    job = enqueue("tests.stop.atomic_polite", {"name": "a", "username": "never-kept"})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["a.started"].wait(20)
        assert _cancel(job) == 1
    finally:
        thread.join(60)
    _ends_cancelled(job)
    assert not get_user_model().objects.filter(username="never-kept").exists()


def test_cancelling_a_running_async_handler_cancels_its_task(slots):
    job = enqueue("tests.stop.async_polite", {"name": "x"})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["x.started"].wait(20)
        assert _cancel(job) == 1
    finally:
        thread.join(60)
    assert SEEN["x.cancelled"] is True
    _ends_cancelled(job)


def test_cancelling_twice_a_finished_job_or_no_job(slots):
    done = enqueue("tests.stop.quick", {"name": "q"})
    run_pending()
    assert _cancel(done) == 0  # just completed: nothing to cancel
    done.refresh_from_db()
    assert done.status == Job.Status.COMPLETED
    assert jobs_cancel(jobs=Job.objects.filter(pk=10**12)) == 0  # no such job

    job = enqueue("tests.stop.thread_waits", {"name": "t"})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["t.started"].wait(20)
        assert _cancel(job) == 1
        assert _cancel(job) == 1  # asked again: the same request, no second outcome
        GATES["t.hold"].set()
    finally:
        thread.join(60)
    _ends_cancelled(job)
    assert _cancel(job) == 0  # cancelled already


def test_a_late_outcome_of_an_older_attempt_changes_nothing(settings):
    """The reaper took a job whose worker died while it was asked to cancel: it ends
    cancelled (not re-queued). The dead attempt's outcome, arriving late, is refused by its
    attempt number; retried by an operator, the next attempt is not cancelled at once."""
    settings.JOBS_LEASE_SECONDS = 0.5
    settings.JOBS_HEARTBEAT_SECONDS = 0.1
    job = enqueue("tests.stop.quick", {"name": "q"}, max_attempts=3)
    [claimed] = job_claim_batch(worker="dead-worker", limit=1)
    assert _cancel(job) == 1
    wait_until(lambda: jobs_reap_stale(), "the reaper took the dead worker's job", timeout=10)
    _ends_cancelled(job, reason="lease expired")
    assert job_record_stopped(job=claimed, worker="dead-worker", reason=STOP_CANCEL) == "lost"

    jobs_retry_now(jobs=Job.objects.filter(pk=job.pk))
    settings.JOBS_LEASE_SECONDS = 120
    settings.JOBS_HEARTBEAT_SECONDS = 30
    run_pending()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.COMPLETED, 2)


@pytest.mark.django_db(transaction=True)
def test_the_admins_cancel_of_a_running_job_asks_first_then_stops_it(slots, admin_client):
    job = enqueue("tests.stop.thread_waits", {"name": "t"})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        assert GATES["t.started"].wait(20)
        detail = reverse("admin:jobs_job_change", args=[job.pk])
        url = reverse("admin:jobs_job_cancel", args=[job.pk])
        assert f'action="{url}"' in admin_client.get(detail).content.decode()
        asked = admin_client.post(url)
        page = " ".join(asked.content.decode().split())
        assert f"Are you sure you want to cancel job #{job.pk}?" in page
        assert "(Processing)" in page
        assert Job.objects.get(pk=job.pk).status == Job.Status.PROCESSING
        done, _fields = _confirm(admin_client, asked)
        assert "asked its worker to stop" in done.content.decode()
        wait_until(lambda: SEEN.get("t.asked") is True, "the handler asked to stop", timeout=20)
        GATES["t.hold"].set()
    finally:
        thread.join(60)
    _ends_cancelled(job)


def test_the_jobs_cancel_command_cancels_a_running_job_and_names_what_it_did(slots, capsys):
    from django.core.management import CommandError, call_command

    done = enqueue("tests.stop.quick", {"name": "q"})
    run_pending()
    queued = enqueue("tests.stop.quick", {"name": "later"}, run_after=None)
    job = enqueue("tests.stop.thread_waits", {"name": "t"}, priority=10)
    result: dict = {}
    thread = drain_in_thread(result, limit=1)
    try:
        assert GATES["t.started"].wait(20)
        call_command("jobs_cancel", str(job.pk), str(done.pk), str(queued.pk))
        out = capsys.readouterr().out
        assert f"job #{job.pk}: running: its worker is asked to stop it" in out
        assert f"job #{done.pk}: completed: nothing to cancel" in out
        assert f"job #{queued.pk}: cancelled (was queued)" in out
        with pytest.raises(CommandError, match=f"no job with id {10**12}"):
            call_command("jobs_cancel", str(10**12))
        wait_until(lambda: SEEN.get("t.asked") is True, "the handler asked to stop", timeout=20)
        GATES["t.hold"].set()
    finally:
        thread.join(60)
    _ends_cancelled(job)
