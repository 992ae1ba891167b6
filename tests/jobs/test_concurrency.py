"""Two worker processes draining the same queue run every job exactly once."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import transaction

from jobs import enqueue
from jobs.models import Job
from tests.support.processes import spawn_manage_py

JOBS = 2000


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_drain_2000_jobs_each_exactly_once(worker_env, tmp_path):
    log = tmp_path / "runs.log"
    with transaction.atomic():
        for n in range(JOBS):
            enqueue("tests.log", {"n": n, "log": str(log), "sleep": 0.002})

    workers = [spawn_manage_py("run_jobs", "--burst", env=worker_env) for _ in range(2)]
    try:
        outputs = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert [worker.returncode for worker in workers] == [0, 0], outputs

    executions = [line.split() for line in log.read_text().splitlines()]
    runs = Counter(int(n) for n, _pid in executions)
    assert sorted(runs) == list(range(JOBS)), outputs
    assert set(runs.values()) == {1}, ("some job ran more than once", outputs)
    assert len({pid for _n, pid in executions}) == 2, "both workers should have taken jobs"
    assert set(Job.objects.values_list("status", "attempts")) == {(Job.Status.COMPLETED, 1)}
