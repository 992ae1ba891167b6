"""Issue 37, points 1, 4 (durable completions share a commit), 5 (I21 per slot) and 7: one
worker process runs many jobs at once, in thread slots and on an event loop, and `async def`
handlers really run (they used to be called, never awaited, and marked completed)."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from jobs import enqueue, run_pending
from jobs.conf import get_config
from jobs.models import Job
from jobs.reaper import jobs_reap_stale
from tests.jobs.handlers import AsyncPeak
from tests.support.processes import killed_on_exit, spawn_manage_py, wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_an_async_handlers_body_runs_and_its_job_completes_only_after_it(tmp_path):
    """The defect: `@handler` took an `async def`, the runner called it, never awaited the
    coroutine, and marked the job completed; not one body ran."""
    log = tmp_path / "runs.log"
    jobs = [enqueue("tests.async_log", {"log": str(log), "n": n}) for n in range(3)]

    summary = run_pending()

    assert (summary.claimed, summary.completed, summary.failed) == (3, 3, 0)
    written = {int(n): float(at) for n, at in (line.split() for line in _lines(log))}
    assert sorted(written) == [0, 1, 2]  # each body ran, once
    for job in jobs:
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED
        # completed after its body wrote its line (the same host's clock)
        assert job.completed_at.timestamp() >= written[job.payload["n"]]


def test_an_async_handler_that_raises_is_a_failure_with_its_error_recorded():
    job = enqueue("tests.async_boom", {"n": 7}, max_attempts=1)

    summary = run_pending()

    assert (summary.claimed, summary.completed, summary.failed) == (1, 0, 1)
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert "ValueError: async handler failed after its await (7)" in job.last_error
    assert job.locked_by == "" and job.completed_at is None


def test_blocking_handlers_run_at_once_in_one_process(tmp_path, settings):
    """JOBS_CONCURRENCY=8: eight handlers that block until the test has seen all eight
    start are running at the same time, in this one process."""
    settings.JOBS_CONCURRENCY = 8
    log, release = tmp_path / "runs.log", tmp_path / "release"
    for n in range(8):
        enqueue("tests.log", {"log": str(log), "n": n, "until": str(release)})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        wait_until(lambda: len(_lines(log)) == 8, "eight handlers running at once", timeout=20)
        assert {line.split()[1] for line in _lines(log)} == {str(os.getpid())}
        assert Job.objects.filter(status=Job.Status.PROCESSING).count() == 8
    finally:
        release.touch()
        thread.join(60)
    assert (result["summary"].completed, result["summary"].lost) == (8, 0)


def test_five_hundred_async_handlers_await_at_once():
    """JOBS_ASYNC_CONCURRENCY (default 500): 500 handlers awaiting asyncio.sleep are all
    awaiting at the same time on the process's event loop (the default JOBS_CONCURRENCY,
    10: the slots' path)."""
    AsyncPeak.running = AsyncPeak.peak = 0
    for n in range(500):
        enqueue("tests.async_peak", {"n": n, "sleep": 4})

    summary = run_pending()

    assert (summary.completed, summary.failed, summary.lost) == (500, 0, 0)
    assert AsyncPeak.peak == 500
    assert Job.objects.filter(status=Job.Status.COMPLETED).count() == 500


def test_the_durable_completions_of_several_slots_share_one_commit(settings):
    """Eight jobs of a kind not declared idempotent end at the same moment in eight slots:
    their completions are flushed before those slots take another job (I21), and several
    go in one statement, one commit, instead of one each."""
    settings.JOBS_CONCURRENCY = 8
    ids = {
        enqueue("tests.rendezvous", {"name": "share", "parties": 8, "n": n}).pk for n in range(8)
    }
    steps: list[tuple[list[int], bool]] = []

    def record(execute, sql, params, many, context):
        if "jobs_runner_step" in sql and params[1]:
            steps.append((list(params[1]), params[-1]))  # (ids completed, without the flush)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        summary = run_pending()

    assert summary.completed == 8
    assert sorted(pk for done, _fast in steps for pk in done) == sorted(ids)  # each once
    assert all(not fast for _done, fast in steps)  # every one flushed
    assert len(steps) < 8, steps
    assert max(len(done) for done, _fast in steps) >= 2, steps


def test_the_job_context_is_the_handlers_second_argument(tmp_path):
    log = tmp_path / "context.log"
    job = enqueue("tests.with_context", {"log": str(log)}, max_attempts=3)
    async_job = enqueue("tests.async_with_context", {"log": str(log)})

    summary = run_pending()

    assert summary.completed == 2
    lines = _lines(log)
    seen = json.loads(next(line for line in lines if line.startswith("{")))
    job.refresh_from_db()
    assert (seen["id"], seen["kind"], seen["attempt"], seen["max_attempts"]) == (
        job.pk,
        "tests.with_context",
        1,
        3,
    )
    assert datetime.fromisoformat(seen["enqueued_at"]) == job.created_at
    started = datetime.fromisoformat(seen["started_at"])
    assert abs((started - job.started_at).total_seconds()) < 1
    # Its deadline: its start plus its kind's timeout (JOBS_DEFAULT_TIMEOUT_SECONDS here).
    timeout = timedelta(seconds=get_config().default_timeout_seconds)
    assert datetime.fromisoformat(seen["deadline"]) == started + timeout
    assert seen["stop_requested"] is False
    assert f"{async_job.pk} tests.async_with_context 1 False" in lines


@pytest.mark.slow
def test_kill_9_with_several_slots_busy_reruns_only_the_jobs_in_flight(
    worker_env, tmp_path, settings
):
    """I21 per slot: `kill -9` of a `run_jobs` running four slots while three of them hold
    a job that never ends: every other job was completed and committed as it ended; after
    the reaper and a new drain only the three in flight ran twice."""
    log, never = tmp_path / "runs.log", tmp_path / "never"
    blockers = {3, 8, 13}
    jobs = [
        enqueue(
            "tests.log",
            {"log": str(log), "n": n, **({"until": str(never)} if n in blockers else {})},
            priority=100 - n,
        )
        for n in range(1, 21)
    ]
    by_n = {job.payload["n"]: job.pk for job in jobs}
    env = {
        **worker_env,
        "JOBS_CONCURRENCY": "4",
        "JOBS_LEASE_SECONDS": "2",
        "JOBS_HEARTBEAT_SECONDS": "0.25",
    }
    quick = {by_n[n] for n in range(1, 21) if n not in blockers}

    def quick_ones_done() -> bool:
        done = set(Job.objects.filter(status=Job.Status.COMPLETED).values_list("pk", flat=True))
        return done == quick

    with killed_on_exit(spawn_manage_py("run_jobs", "--burst", env=env)) as worker:
        wait_until(quick_ones_done, "the 17 quick jobs completed beside the blockers", timeout=60)
        runs = [int(line.split()[0]) for line in _lines(log)]
        assert set(runs) == set(range(1, 21))
        worker.kill()  # kill -9

    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    reaped: list = []
    wait_until(
        lambda: reaped.extend(jobs_reap_stale()) or len(reaped) == 3,
        "the dead worker's three rows reaped",
        timeout=30,
    )
    never.touch()
    run_pending()

    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.COMPLETED}
    counts: dict[int, int] = {}
    for line in _lines(log):
        n = int(line.split()[0])
        counts[n] = counts.get(n, 0) + 1
    assert counts == {n: (2 if n in blockers else 1) for n in range(1, 21)}


MARK_STATEMENTS = """
CREATE TABLE test_mark_statements (rows integer NOT NULL);
CREATE FUNCTION test_count_mark_statements() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_mark_statements (rows)
    SELECT count(*) FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
    WHERE o.started_at IS NULL AND n.started_at IS NOT NULL
      AND o.status = 'processing' AND n.status = 'processing'
    HAVING count(*) > 0;
    RETURN NULL;
END $$;
CREATE TRIGGER test_count_mark_statements AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION test_count_mark_statements();
"""


def test_the_keeper_marks_the_starts_of_many_running_slots_in_one_statement(settings):
    """Eight jobs run at once in eight slots, longer than JOBS_HOLD_UNSTARTED_SECONDS: the
    keeper shows each one's start while it runs (each handler waits for its own row's
    started_at), with one statement for the slots that crossed the hold together, not one
    transaction of four round trips per job (5,000 async jobs of 1 s made 5,000 of them, one
    after another: bench/against_pgqueuer.py). The starts are started together by a barrier:
    at most two keeper ticks see them cross."""
    settings.JOBS_CONCURRENCY = 8
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 0.5  # a keeper tick every 0.25 s
    with connection.cursor() as cursor:
        cursor.execute(MARK_STATEMENTS)
    try:
        for _n in range(8):
            enqueue("tests.until_marked_started", {"name": "marks", "parties": 8})
        summary = run_pending()
        with connection.cursor() as cursor:
            cursor.execute("SELECT rows FROM test_mark_statements")
            statements = [rows for (rows,) in cursor.fetchall()]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_count_mark_statements ON jobs_job")
            cursor.execute("DROP FUNCTION test_count_mark_statements()")
            cursor.execute("DROP TABLE test_mark_statements")

    assert (summary.completed, summary.failed) == (8, 0), summary.errors
    assert sum(statements) == 8, statements  # each job's start shown once, while it ran
    assert len(statements) <= 2, statements


def test_a_drain_whose_time_is_up_gives_back_the_jobs_it_could_not_start_and_ends(
    tmp_path, settings
):
    """The scale-out rehearsal's stall: a drain with slots claimed more jobs than its free
    slots (a claim past them, migration 0028); its JOBS_DRAIN_SECONDS passed with some
    still unstarted, and the drain, allowed to start nothing more and with nothing running
    (quick jobs: the keeper gives back only behind a job running longer than
    JOBS_HOLD_UNSTARTED_SECONDS), waited for outcomes that could not come, holding those
    jobs `processing` until django-q2's Q_TIMEOUT killed it (300 s), and then a reap.
    Two slots, 30 ms jobs, nothing given back behind them: 52 claimed at once need 0.78 s,
    the drain has 0.4 s (a loaded machine's first claim may take most of it: none started
    is the same stall)."""
    settings.JOBS_CONCURRENCY = 2
    settings.JOBS_CLAIM_BATCH_SIZE = 50
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 600
    log = tmp_path / "runs.log"
    jobs = [enqueue("tests.log", {"n": n, "log": str(log), "sleep": 0.03}) for n in range(60)]
    result: dict = {}
    stop = threading.Event()

    thread = drain_in_thread(result, max_seconds=0.4, stop=stop)
    thread.join(timeout=20)
    hung = thread.is_alive()
    stop.set()  # a hung drain ends now: the test's teardown needs the rows
    thread.join(timeout=20)

    assert not hung, "the drain did not end after its time was up"
    summary = result["summary"]
    ran = [int(line.split()[0]) for line in _lines(log)]
    assert summary.budget_exhausted
    assert summary.completed == len(ran) < len(jobs)
    for job in jobs:
        job.refresh_from_db()
        if job.payload["n"] in ran:
            assert (job.status, job.attempts) == (Job.Status.COMPLETED, 1)
        else:  # back in the queue as if never claimed: no attempt spent, no owner
            assert (job.status, job.attempts, job.locked_by) == (Job.Status.QUEUED, 0, "")
