"""The job loop's concurrency guards, each caught by a test if it is removed (issue 14).

* The claim takes its rows with `FOR UPDATE SKIP LOCKED`: concurrent drains never wait for
  each other and never take a row another claim holds.
* Every write to a `processing` row is guarded by `locked_by` (the owner's run id) as well
  as by the status: a worker whose row was reaped and re-claimed by another gets LeaseLost,
  and the other worker's attempt stands.

The table in docs/architecture.md ("Guards and the tests that catch their removal") lists
the one-line mutant each test was seen failing on.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from jobs import enqueue, handler, run_pending
from jobs.exceptions import LeaseLost
from jobs.models import Job
from jobs.outcomes import job_complete, job_record_failure
from jobs.reaper import jobs_reap_stale
from jobs.runner_step import ClaimedJob, job_claim_batch
from tests.support.locks import LockWait, LockWaitWatcher, OpenTransaction
from tests.support.processes import spawn_manage_py

User = get_user_model()
Status = Job.Status

IN_FLIGHT = "other-host:4242:inflight"  # the run id of a claim that has not committed yet
SECOND_WORKER = "other-host:4243:second"
SLOW_JOBS = 45
DRAINS = 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_drains_run_each_slow_job_once_and_never_wait_on_a_held_claim(
    worker_env, tmp_path
):
    """Three `run_jobs --burst` processes drain 45 slow jobs at once, small claim batches so
    their claims interleave, while a fourth claim is in flight (it has locked the
    highest-priority row and not committed). With SKIP LOCKED no drain ever waits on a lock
    (sampled from another connection for the whole drain), every job runs exactly once, and
    the in-flight claim keeps its row.

    Without SKIP LOCKED (`FOR UPDATE` alone) the drains queue up behind the held row; with no
    row lock at all they also wait (the UPDATE locks it) and then overwrite the other
    claim, running its job as well.
    """
    log = tmp_path / "runs.log"
    held = enqueue("tests.noop", priority=10)
    with transaction.atomic():
        for n in range(SLOW_JOBS):
            enqueue("tests.log", {"n": n, "log": str(log), "sleep": 0.05})
    env = {
        **worker_env,
        "JOBS_CLAIM_BATCH_SIZE": "3",
        # No heartbeat during the drain: a renewal may briefly wait for the worker's own
        # completion to commit, which is not the wait this test is about.
        "JOBS_LEASE_SECONDS": "3600",
        "JOBS_HEARTBEAT_SECONDS": "1800",
    }

    claim = OpenTransaction(lambda: job_claim_batch(worker=IN_FLIGHT, limit=1))
    with (
        claim,
        LockWaitWatcher(on_first_wait=claim.release, ignore=_is_on_a_counter_shard) as watcher,
    ):
        assert [job.id for job in claim.result] == [held.pk]
        drains = [spawn_manage_py("run_jobs", "--burst", env=env) for _ in range(DRAINS)]
        try:
            outputs = [drain.communicate(timeout=180) for drain in drains]
        finally:
            for drain in drains:
                if drain.poll() is None:
                    drain.kill()
                    drain.wait(timeout=10)
    assert [drain.returncode for drain in drains] == [0] * DRAINS, outputs
    assert watcher.samples > 10, "the watcher must have sampled during the drain"

    assert watcher.waits == [], "a drain waited on a row lock:\n" + watcher.report()
    runs = Counter(int(line.split()[0]) for line in log.read_text().splitlines())
    assert sorted(runs) == list(range(SLOW_JOBS)), "some job never ran"
    assert [n for n, count in runs.items() if count > 1] == [], "some job ran more than once"
    held.refresh_from_db()
    assert (held.status, held.locked_by, held.attempts) == (Status.PROCESSING, IN_FLIGHT, 1)
    assert set(
        Job.objects.filter(kind="tests.log").values_list("status", "attempts", "locked_by")
    ) == {(Status.COMPLETED, 1, "")}


# The statement triggers' counter rows (job counts, metric series, per-kind periods) are
# sharded by backend pid modulo 16: two drains on one shard wait a moment for each other's
# commit. That is not a claim waiting on a held job, which this test is about.
_COUNTER_TABLES = {"jobs_jobcount", "ops_metricseries", "ops_jobperiod"}


def _is_on_a_counter_shard(wait: LockWait) -> bool:
    return bool(wait.row_tables) and set(wait.row_tables) <= _COUNTER_TABLES


def _reap_and_reclaim_as_second_worker() -> ClaimedJob:
    """The first worker stalled past its lease: the reaper hands the row back (due at once,
    backoff base 0) and a second worker claims it. Runs on its own connection, like the
    reaper and the second worker would."""
    result: list[ClaimedJob] = []

    def other_processes() -> None:
        try:
            jobs_reap_stale(older_than=-5)  # every processing row counts as stale
            result.extend(job_claim_batch(worker=SECOND_WORKER, limit=10))
        finally:
            connection.close()

    thread = threading.Thread(target=other_processes)
    thread.start()
    thread.join(timeout=30)
    assert len(result) == 1, "the second worker should have re-claimed the reaped row"
    return result[0]


@pytest.mark.django_db(transaction=True)
def test_completion_by_a_worker_whose_row_was_reaped_and_reclaimed_raises_lease_lost(settings):
    """Status alone cannot tell the two attempts apart (both are `processing`): only
    `locked_by` can. The first worker's late completion raises LeaseLost and changes
    nothing; the second worker's attempt stands and completes."""
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    job = enqueue("tests.noop")
    [first] = job_claim_batch(worker="first-host:1:a", limit=1)

    second = _reap_and_reclaim_as_second_worker()
    assert (second.id, second.attempts) == (job.pk, 2)

    with pytest.raises(LeaseLost), transaction.atomic():
        job_complete(job=first, worker="first-host:1:a")
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Status.PROCESSING, SECOND_WORKER, 2)
    assert job.completed_at is None

    job_complete(job=second, worker=SECOND_WORKER)
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Status.COMPLETED, 2)
    assert job.completed_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_failure_reported_by_a_worker_that_lost_its_row_leaves_the_new_attempt_alone(
    settings,
):
    """The twin of the completion guard: the first worker's late failure must neither
    re-queue nor fail the row the second worker now runs."""
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    job = enqueue("tests.noop", max_attempts=2)
    [first] = job_claim_batch(worker="first-host:1:a", limit=1)
    second = _reap_and_reclaim_as_second_worker()

    outcome = job_record_failure(job=first, worker="first-host:1:a", exc=RuntimeError("late"))

    assert outcome == "lost"
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Status.PROCESSING, SECOND_WORKER, 2)
    assert job.failed_at is None and "late" not in job.last_error
    job_complete(job=second, worker=SECOND_WORKER)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED


@handler("tests.guards.reclaimed_midway")
def reclaimed_midway(payload: dict) -> None:
    """This attempt's own work, then (while it still runs) the reaper and a second worker
    take its row over."""
    User.objects.create(username=payload["username"])
    _reap_and_reclaim_as_second_worker()


@pytest.mark.django_db(transaction=True)
def test_the_runner_rolls_back_an_attempt_whose_row_was_reclaimed_and_the_second_stands(
    settings, one_slot
):
    """Through the job loop: the first drain's completion finds the row owned by the second
    worker, counts the attempt as lost and rolls its work back; the row stays the second
    worker's, which then completes it. One slot: with slots the drain itself claims while
    its handler runs, so it races the second worker for the row the reaper gave back (the
    same drain taking it again is test_a_late_outcome_of_an_earlier_attempt_by_the_same_...)."""
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    job = enqueue("tests.guards.reclaimed_midway", {"username": "first-attempt"})

    summary = run_pending()

    assert (summary.claimed, summary.lost, summary.completed) == (1, 1, 0)
    assert not User.objects.filter(username="first-attempt").exists()
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Status.PROCESSING, SECOND_WORKER, 2)
    second = ClaimedJob(
        id=job.pk, kind=job.kind, payload=job.payload, attempts=2, max_attempts=job.max_attempts
    )
    job_complete(job=second, worker=SECOND_WORKER)
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.completed_at is not None


def _reclaimed_by_another_worker(job_pk: int) -> None:
    """Worker `a` claims the job, its lease runs out, the reaper re-queues it and worker `b`
    claims it: the row is `processing`, `b`'s, at its second attempt."""
    from jobs.runner_step import job_runner_step

    assert [c.id for c in job_runner_step(worker="a", claim=1).claimed] == [job_pk]
    Job.objects.filter(pk=job_pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert [j.id for j in jobs_reap_stale()] == [job_pk]
    Job.objects.filter(pk=job_pk).update(run_after=timezone.now())  # skip the backoff
    assert [c.id for c in job_runner_step(worker="b", claim=1).claimed] == [job_pk]


@pytest.mark.django_db(transaction=True)
def test_a_completion_sent_for_a_job_another_worker_now_holds_changes_nothing():
    """Survivor 1 of issue 29: `jobs_runner_step` without `locked_by = p_worker` in its
    completions passed every test. A worker whose row was reaped and claimed by another
    worker sends its late completion: the other worker's attempt must stay running."""
    from jobs.runner_step import job_runner_step

    job = enqueue("tests.noop")
    _reclaimed_by_another_worker(job.pk)

    step = job_runner_step(worker="a", done=[(job.pk, 0.01)])

    assert step.completed == frozenset()
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Job.Status.PROCESSING, "b", 2)
    assert job.completed_at is None


@pytest.mark.django_db(transaction=True)
def test_a_give_back_sent_for_a_job_another_worker_now_holds_changes_nothing():
    """Survivor 2 of issue 29: the same guard dropped from the give-back. The late give-back
    must not put the other worker's running job back in the queue (it would run twice) nor
    undo its attempt."""
    from jobs.runner_step import job_runner_step

    job = enqueue("tests.noop")
    _reclaimed_by_another_worker(job.pk)

    step = job_runner_step(worker="a", release=[job.pk])

    assert step.released == 0
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Job.Status.PROCESSING, "b", 2)


@pytest.mark.django_db(transaction=True)
def test_a_late_outcome_of_an_earlier_attempt_by_the_same_worker_changes_nothing(settings):
    """With slots a drain is itself a claimer while its slots run: the reaper gives back a
    row one of them still runs and the same drain (the same `locked_by`) claims it again.
    The first attempt's late completion or failure must leave the second attempt alone:
    only the attempt number tells the two apart."""
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    job = enqueue("tests.noop", max_attempts=3)
    [first] = job_claim_batch(worker="same-host:1:a", limit=1)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert [j.id for j in jobs_reap_stale()] == [job.pk]
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    [second] = job_claim_batch(worker="same-host:1:a", limit=1)
    assert (second.id, second.attempts) == (job.pk, 2)

    assert job_record_failure(job=first, worker="same-host:1:a", exc=RuntimeError("late")) == (
        "lost"
    )
    with pytest.raises(LeaseLost), transaction.atomic():
        job_complete(job=first, worker="same-host:1:a")
    job.refresh_from_db()
    assert (job.status, job.locked_by, job.attempts) == (Status.PROCESSING, "same-host:1:a", 2)
    assert job.completed_at is None and "late" not in job.last_error
