"""Issue 29, point 2 (invariant I21): a runner statement whose outcome is unknown never
starts a job. Each of the runner's statements (claim, mark started, complete, give back
by the keeper and at the drain's end) is run for real, commits, and then loses its answer
(tests/support/lost_answer.py). After it no job runs twice: every job's handler appends a
line to a log file outside the database, so a second run shows whatever the database says.
A job whose state is unknown is left to its lease and the reaper.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs import enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.reaper import jobs_reap_stale
from jobs.runner import run_pending as run_drain
from tests.support.lost_answer import LostAnswer, LostBeforeCommit
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def _step(sql: str, params) -> dict | None:
    """The runner statement's arguments by name (jobs.runner_step._RUNNER_STEP_SQL), or None
    for any other statement."""
    if "jobs_runner_step" not in sql or not params:
        return None
    return {"done": params[1], "mark": params[3], "release": params[5], "claim": params[6]}


def claim(sql, params) -> bool:
    step = _step(sql, params)
    return step is not None and step["claim"] > 0


def mark(sql, params) -> bool:
    """The keeper's mark of the jobs running longer than the hold (one statement for all of
    them, jobs.outcomes.jobs_mark_started; earlier, the runner statement's `mark`)."""
    if "jobs_mark_started" in sql:
        return True
    step = _step(sql, params)
    return step is not None and step["mark"] is not None


def complete(sql, params) -> bool:
    step = _step(sql, params)
    return step is not None and bool(step["done"])


def give_back(sql, params) -> bool:
    step = _step(sql, params)
    return step is not None and bool(step["release"])


def _runs(log: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in log.read_text().splitlines():
        n = int(line.split()[0])
        counts[n] = counts.get(n, 0) + 1
    return counts


def _all_completed_once(log: Path, jobs: list[Job]) -> None:
    assert _runs(log) == {job.payload["n"]: 1 for job in jobs}
    statuses = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True))
    assert statuses == {Job.Status.COMPLETED}


def test_a_claim_whose_answer_is_lost_is_left_to_the_lease_and_the_reaper(settings, tmp_path):
    """The first claim takes jobs 1 and 2, commits, and its answer is lost; the drain claims
    again (3 and 4). Nobody starts 1 and 2 on a guess, and nobody renews their lease: the
    reaper gives them back while job 3 still runs, and they run once."""
    settings.JOBS_CLAIM_BATCH_SIZE = 2
    settings.JOBS_LEASE_SECONDS = 1.0
    settings.JOBS_HEARTBEAT_SECONDS = 0.2
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 600  # the keeper gives nothing back here
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    log, release = tmp_path / "runs.log", tmp_path / "release"
    jobs = [
        enqueue("tests.log", {"log": str(log), "n": 1}, priority=9),
        enqueue("tests.log", {"log": str(log), "n": 2}, priority=9),
        enqueue("tests.log", {"log": str(log), "n": 3, "until": str(release)}, priority=5),
        enqueue("tests.log", {"log": str(log), "n": 4}, priority=0),
    ]
    result: dict = {}
    with LostAnswer(claim) as fault:
        drain = drain_in_thread(result)
        try:
            wait_until(lambda: log.exists() and "3 " in log.read_text(), "job 3 started")
            reaped: list = []
            wait_until(
                lambda: reaped.extend(jobs_reap_stale()) or len(reaped) == 2,
                "the lost claim's two jobs reaped after their lease (nothing renews it)",
                timeout=15,
            )
            assert sorted(job.id for job in reaped) == [jobs[0].pk, jobs[1].pk]
        finally:
            release.touch()
            drain.join(60)
    assert len(fault.fired) == 1
    _all_completed_once(log, jobs)
    assert result["summary"].completed == 4


def test_a_mark_whose_answer_is_lost_runs_the_job_once(settings, tmp_path):
    """The keeper marks a long job started; the mark commits and its answer is lost. The job
    and the quick ones given back behind it run once each; the job's attempt is recorded."""
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 0.05
    log = tmp_path / "runs.log"
    slow = enqueue("tests.log", {"log": str(log), "n": 0, "sleep": 0.6}, priority=9)
    quick = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(1, 4)]
    with LostAnswer(mark) as fault:
        summary = run_pending()
    assert len(fault.fired) == 1
    _all_completed_once(log, [slow, *quick])
    assert (summary.completed, summary.lost) == (4, 0)
    attempt = JobAttempt.objects.get(job_id=slow.pk)
    assert (attempt.number, attempt.outcome) == (1, "completed")


def test_a_completion_whose_answer_is_lost_is_sent_again_and_no_job_runs_twice(settings, tmp_path):
    """A job not declared idempotent is completed, durably, before the next one starts; that
    statement commits and its answer is lost. The runner sends it again (a guarded
    completion changes nothing the second time), counts the job completed (its attempt says
    so), and goes on: no job runs twice, none is left processing."""
    log = tmp_path / "runs.log"
    jobs = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(1, 4)]
    with LostAnswer(complete) as fault:
        summary = run_pending()
    assert len(fault.fired) == 1
    _all_completed_once(log, jobs)
    assert (summary.completed, summary.lost) == (3, 0)


@pytest.mark.usefixtures("one_slot")
def test_a_keepers_give_back_whose_answer_is_lost_never_runs_a_job_twice(settings, tmp_path):
    """The issue's case: the keeper gives back the jobs behind a long one; the statement
    commits and its answer is lost, and the long job ends before the keeper's next tick.
    The keeper used to put the jobs back in its batch though their rows were queued again:
    the drain claimed them again and ran each twice. They are now left to the queue (or,
    had the statement not committed, to their lease and the reaper)."""
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 0.05
    log, release = tmp_path / "runs.log", tmp_path / "release"
    slow = enqueue("tests.log", {"log": str(log), "n": 0, "until": str(release)}, priority=9)
    quick = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(1, 6)]

    def long_job_ends_while_the_answer_is_awaited() -> None:
        release.touch()
        time.sleep(0.3)

    with LostAnswer(give_back, on_fire=long_job_ends_while_the_answer_is_awaited) as fault:
        summary = run_pending()
    assert len(fault.fired) == 1
    _all_completed_once(log, [slow, *quick])
    assert summary.completed == 6
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


@pytest.mark.usefixtures("one_slot")
def test_a_final_give_back_whose_answer_is_lost_leaves_the_jobs_to_the_queue(settings, tmp_path):
    """The drain runs out of time and gives back what it never started; that statement
    commits and its answer is lost. Nothing is started on a guess; the jobs run once, later."""
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 600
    log = tmp_path / "runs.log"
    slow = enqueue("tests.log", {"log": str(log), "n": 0, "sleep": 0.4}, priority=9)
    quick = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(1, 4)]
    with LostAnswer(give_back) as fault:
        first = run_drain(max_seconds=0.2)
    assert len(fault.fired) == 1
    assert first.completed == 1 and _runs(log) == {0: 1}
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in quick]).values_list("status", flat=True)
    ) == {Job.Status.QUEUED}
    run_pending()
    _all_completed_once(log, [slow, *quick])


@pytest.mark.usefixtures("one_slot")
def test_an_unknown_give_back_that_did_not_commit_goes_to_the_reaper(settings, tmp_path):
    """The other side of an unknown outcome: the keeper's give-back fails before it commits.
    The jobs stay this drain's rows, which it will never start; their lease is not renewed,
    so the reaper gives them back and they run once."""
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 0.05
    settings.JOBS_LEASE_SECONDS = 1.0
    settings.JOBS_HEARTBEAT_SECONDS = 0.2
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    log, release = tmp_path / "runs.log", tmp_path / "release"
    slow = enqueue("tests.log", {"log": str(log), "n": 0, "until": str(release)}, priority=9)
    quick = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(1, 4)]
    result: dict = {}
    with LostBeforeCommit(give_back) as fault:
        drain = drain_in_thread(result)
        try:
            wait_until(lambda: fault.fired, "the give-back tried")
            reaped: list = []
            wait_until(
                lambda: reaped.extend(jobs_reap_stale()) or len(reaped) == 3,
                "the unstarted jobs reaped after their lease",
                timeout=15,
            )
            assert sorted(job.id for job in reaped) == [job.pk for job in quick]
            assert _runs(log) == {0: 1}  # none started on a guess
        finally:
            release.touch()
            drain.join(60)
    _all_completed_once(log, [slow, *quick])
