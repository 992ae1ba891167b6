"""Issue 29, point 1 (invariant I21): safe by default, fast where it is safe.

A kind not declared `idempotent=True` has its completion committed, with the WAL flush,
before the next job of the batch starts: `kill -9` of the worker re-runs at most the job in
flight, and a crash of PostgreSQL re-runs no job whose completion the worker saw committed.
Idempotent kinds keep the batched completion without the flush
(test_runner.py::test_jobs_that_write_nothing_cost_one_statement_per_batch).

Every handler here appends a line to a file outside the database on each run, so a second
run shows whatever the database lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from jobs import enqueue, run_pending
from jobs.models import Job
from jobs.reaper import jobs_reap_stale
from tests.support.processes import killed_on_exit, manage_py, spawn_manage_py, wait_until
from tests.support.throwaway_pg import ThrowawayCluster


def _runs(log: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        n = int(line.split()[0])
        counts[n] = counts.get(n, 0) + 1
    return counts


@pytest.mark.usefixtures("one_slot")
@pytest.mark.django_db(transaction=True)
def test_each_completion_of_a_kind_not_declared_idempotent_is_flushed_before_the_next_job(
    tmp_path,
):
    """Three jobs of a kind that writes nothing in the database (its effect is elsewhere):
    after each one, its completion is a statement of its own, committed with the flush,
    before the next handler runs; the last one's goes with the next claim."""
    log = tmp_path / "runs.log"
    jobs = [enqueue("tests.log", {"log": str(log), "n": n}) for n in range(3)]
    seen: list[tuple[int, list[int], bool, dict[int, int]]] = []

    def record(execute, sql, params, many, context):
        if "jobs_runner_step" in sql:
            # (claim size, ids completed, committed without the flush, runs so far)
            seen.append((params[6], list(params[1]), params[-1], _runs(log)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        summary = run_pending()

    ids = [job.pk for job in jobs]
    assert summary.completed == 3
    assert seen == [
        (20, [], True, {}),  # the claim: nothing to lose
        (0, [ids[0]], False, {0: 1}),  # job 0 completed, flushed, before job 1 runs
        (0, [ids[1]], False, {0: 1, 1: 1}),
        (20, [ids[2]], False, {0: 1, 1: 1, 2: 1}),  # the last one with the next claim
    ]


@pytest.mark.usefixtures("one_slot")
@pytest.mark.django_db(transaction=True)
def test_an_operator_may_have_every_completion_flushed_idempotent_or_not(settings):
    """JOBS_BATCH_IDEMPOTENT_COMPLETIONS=False: the completions of kinds declared idempotent
    are flushed one by one too, before the next job starts."""
    settings.JOBS_BATCH_IDEMPOTENT_COMPLETIONS = False
    ids = [enqueue("tests.noop", {"n": n}).pk for n in range(3)]
    seen: list[tuple[int, list[int], bool]] = []

    def record(execute, sql, params, many, context):
        if "jobs_runner_step" in sql:
            seen.append((params[6], list(params[1]), params[-1]))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        summary = run_pending()

    assert summary.completed == 3
    assert seen == [
        (20, [], True),
        (0, [ids[0]], False),
        (0, [ids[1]], False),
        (20, [ids[2]], False),
    ]


@pytest.mark.usefixtures("one_slot")
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_kill_9_mid_batch_reruns_only_the_job_in_flight(worker_env, tmp_path, settings):
    """The issue's case: one `kill -9` after 10 quick jobs of a batch of 20 left all 10
    `processing` (their completions waited for the batch's end); the reaper re-queued them
    and each ran again. Now only the job running at the kill runs again."""
    log, never = tmp_path / "runs.log", tmp_path / "never"
    jobs = [
        enqueue(
            "tests.log",
            {"log": str(log), "n": n, **({"until": str(never)} if n == 11 else {})},
            priority=100 - n,
        )
        for n in range(1, 21)
    ]
    env = {
        **worker_env,
        "JOBS_CLAIM_BATCH_SIZE": "20",
        "JOBS_HOLD_UNSTARTED_SECONDS": "600",  # the keeper sends nothing before the kill
        "JOBS_LEASE_SECONDS": "2",
        "JOBS_HEARTBEAT_SECONDS": "0.25",
    }
    with killed_on_exit(spawn_manage_py("run_jobs", "--burst", env=env)) as worker:
        wait_until(lambda: 11 in _runs(log), "job 11 started", timeout=60)
        worker.kill()  # kill -9

    by_n = {job.payload["n"]: job.pk for job in jobs}
    done_before = set(Job.objects.filter(status=Job.Status.COMPLETED).values_list("pk", flat=True))
    assert done_before == {by_n[n] for n in range(1, 11)}  # each one committed as it ended

    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    reaped: list = []
    wait_until(
        lambda: reaped.extend(jobs_reap_stale()) or len(reaped) == 10,
        "the dead worker's rows reaped",
        timeout=30,
    )
    never.touch()
    run_pending()

    assert set(Job.objects.values_list("status", flat=True)) == {Job.Status.COMPLETED}
    runs = _runs(log)
    assert runs == {n: (2 if n == 11 else 1) for n in range(1, 21)}


@pytest.fixture
def cluster():
    cluster = ThrowawayCluster()
    try:
        yield cluster.create()
    finally:
        cluster.destroy()


def _enqueue_plain(conn, log: Path, n: int, *, priority: int, **extra) -> None:
    import json

    conn.execute(
        "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
        "run_after, created_at, locked_by, last_error) VALUES ('tests.log', %s, 'queued', %s, "
        "0, 5, now(), now(), '', '')",
        [json.dumps({"log": str(log), "n": n, **extra}), priority],
    )


@pytest.mark.usefixtures("one_slot")
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_database_crash_reruns_no_job_whose_completion_the_worker_saw(
    worker_env, tmp_path, cluster
):
    """PostgreSQL is killed (`pg_ctl stop -m immediate`) while a worker drains 40 jobs of a
    kind not declared idempotent. Completions committed without the flush were lost with
    the server's memory, and their jobs ran again. Now, after restart, reaping and a second
    drain, every job has completed and at most the job in flight at the crash ran twice."""
    log = tmp_path / "runs.log"
    with cluster.connect() as conn:
        for n in range(40):
            _enqueue_plain(conn, log, n, priority=100 - n, sleep=0.02)
    env = {
        **worker_env,
        "DATABASE_URL": cluster.url,
        "JOBS_CLAIM_BATCH_SIZE": "20",
        "JOBS_HOLD_UNSTARTED_SECONDS": "600",
        "JOBS_LEASE_SECONDS": "60",
        "JOBS_HEARTBEAT_SECONDS": "20",  # a heartbeat's commit would flush the WAL
        "PROCESS_HEARTBEAT_SECONDS": "600",
        "JOBS_BACKOFF_BASE_SECONDS": "0",
    }
    with killed_on_exit(spawn_manage_py("run_jobs", "--burst", env=env)) as worker:
        wait_until(lambda: len(_runs(log)) >= 12, "a dozen jobs run", timeout=60, interval=0.01)
        cluster.crash()
        worker.kill()
    started = [int(line.split()[0]) for line in log.read_text().splitlines()]
    cluster.start()
    with cluster.connect() as conn:  # the dead worker's lease runs out
        conn.execute(
            "UPDATE jobs_job SET lease_expires_at = now() - interval '1 second' "
            "WHERE status = 'processing'"
        )
    reap = manage_py("reap_stale", env=env, timeout=60)
    assert reap.returncode == 0, reap.stderr
    rerun = manage_py("run_jobs", "--burst", env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr

    with cluster.connect() as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM jobs_job GROUP BY 1").fetchall())
    assert statuses == {"completed": 40}
    runs = _runs(log)
    assert set(runs) == set(range(40))
    # Job n+1 starts only after job n's completion came back committed: only the last job
    # that started before the crash may run again.
    twice = {n for n, count in runs.items() if count > 1}
    assert twice <= {started[-1]} and max(runs.values()) <= 2, (started[-1], runs)


@pytest.mark.usefixtures("one_slot")
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_keepers_hand_back_survives_a_database_crash(worker_env, tmp_path, cluster):
    """Survivor 3 of the issue: the keeper's hand-back committed without the flush passed
    every test. Given back while a long job runs, the quick jobs are `queued` to everyone
    who looks; a crash of the server right after must not undo that (the rows would come
    back `processing`, held by a worker that goes on as if they were gone)."""
    log, never = tmp_path / "runs.log", tmp_path / "never"
    with cluster.connect() as conn:
        _enqueue_plain(conn, log, 0, priority=9, until=str(never))
        for n in range(1, 6):
            _enqueue_plain(conn, log, n, priority=0)
    env = {
        **worker_env,
        "DATABASE_URL": cluster.url,
        "JOBS_HOLD_UNSTARTED_SECONDS": "0.05",
        "JOBS_LEASE_SECONDS": "120",
        "JOBS_HEARTBEAT_SECONDS": "60",  # no flush from a heartbeat in between
        "PROCESS_HEARTBEAT_SECONDS": "600",
    }

    def given_back() -> bool:
        with cluster.connect() as conn:
            return conn.execute(
                "SELECT count(*) FROM jobs_job WHERE status = 'queued' AND attempts = 0"
            ).fetchone() == (5,)

    with killed_on_exit(spawn_manage_py("run_jobs", "--burst", env=env)) as worker:
        wait_until(lambda: 0 in _runs(log), "the long job started", timeout=60)
        wait_until(given_back, "the quick jobs given back", timeout=10, interval=0.01)
        cluster.crash()
        worker.kill()
    cluster.start()

    assert given_back(), "the hand-back was lost in the crash"
