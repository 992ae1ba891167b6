"""Thread slots and Django's connection pool (project/db_pool.py): a slot checks a
connection out while its handler needs one and gives it back after the job when another
slot waits for one (else once it idles), so a process opens at most DB_POOL_MAX_SIZE server
connections however many slots it runs.

Before the pool each slot thread opened a connection of its own and kept it until it had
idled a second: JOBS_CONCURRENCY=50 slots running handlers that query once opened about 50.
A pooled slot that kept its connection from job to job (as the thread-local one was kept)
would keep the others waiting for one as long as it had jobs: with the pool's timeout they
failed instead."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

import tests.jobs.pool_handlers  # noqa: F401 - the kind enqueued below
from jobs import enqueue_many
from jobs.models import Job, JobAttempt
from tests.support.processes import manage_py

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 200


def test_fifty_slots_open_at_most_the_pools_size_and_every_job_runs_once(worker_env, tmp_path):
    log = tmp_path / "backends.log"
    enqueue_many(
        "tests.pool.query_then_wait",
        [{"n": n, "log": str(log), "seconds": 0.2} for n in range(JOBS)],
    )
    env = {
        **worker_env,
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.pool_handlers",
        "JOBS_CONCURRENCY": "50",
        "DB_POOL": "1",
        "DB_POOL_MAX_SIZE": "6",
        "DB_POOL_TIMEOUT": "10",
        "JOBS_LINGER_SECONDS": "0",
    }
    for _ in range(20):  # a burst may end between two claims: again until all ran
        result = manage_py("run_jobs", "--burst", env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        # Nobody timed out waiting for a connection: not a slot (its share of the pool says
        # "a job slot waited ... (DB_POOL_TIMEOUT)"), not the keeper (the pool's own
        # "couldn't get a connection ... DB_POOL_TIMEOUT=").
        assert "DB_POOL_TIMEOUT" not in result.stdout + result.stderr, result.stderr
        if not Job.objects.exclude(status=Job.Status.COMPLETED).exists():
            break
    assert Job.objects.exclude(status=Job.Status.COMPLETED).count() == 0, result.stderr
    again = list(Job.objects.filter(attempts__gt=1).values_list("id", flat=True))
    history = JobAttempt.objects.filter(job_id__in=again).values_list(
        "job_id", "number", "outcome", "error"
    )
    assert again == [], list(history)
    rows = [line.split() for line in Path(log).read_text().splitlines()]
    assert len(rows) == JOBS
    by_process: dict[str, set[str]] = defaultdict(set)
    for process, backend in rows:
        by_process[process].add(backend)
    # Six in each process: its slots share four, its drain and keeper hold the other two.
    assert max(len(backends) for backends in by_process.values()) <= 6, by_process
