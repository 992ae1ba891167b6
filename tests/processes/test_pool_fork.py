"""A real qcluster with Django's connection pool (project/db_pool.py): its main process uses
the pool before django-q2 forks the sentinel and the workers (ensure_schedules, then the
sentinel's close_all, which puts the connection back into the pool, open). The pool lives in
a class-level dict whose idle connections are the parent's sockets: a child that took one
would talk on its parent's session, and two children would share one. Each child must start
a pool of its own, and the parent's connections must keep working."""

from __future__ import annotations

import subprocess
from collections import defaultdict

import pytest

import tests.jobs.pool_handlers  # noqa: F401 - the kind enqueued below
from jobs import enqueue, enqueue_many
from jobs.models import Job
from tests.jobs import handlers  # noqa: F401 - registers tests.noop in this process
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOBS = 80


def _all_done() -> bool:
    return not Job.objects.exclude(status=Job.Status.COMPLETED).exists()


def test_two_forked_workers_each_use_a_pool_of_their_own_and_the_parents_still_works(
    subprocess_env, tmp_path
):
    log, cluster_log = tmp_path / "backends.log", tmp_path / "qcluster.log"
    env = {
        **subprocess_env,
        "Q_WORKERS": "2",
        "DB_POOL": "1",
        "JOBS_CONCURRENCY": "4",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers,tests.jobs.pool_handlers",
    }
    with cluster_log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(
            lambda: "job wake-up listener connected" in cluster_log.read_text(), "listening", 60
        )
        enqueue_many(
            "tests.pool.query_then_wait",
            [{"n": n, "log": str(log), "seconds": 0.5} for n in range(JOBS)],
        )
        wait_until(_all_done, "every job run", timeout=180)
        # The main process's own pooled connection (the listener's wake task) still works
        # after its children used theirs: a later job is woken and run.
        later = enqueue("tests.noop", {})
        wait_until(
            lambda: Job.objects.get(id=later.id).status == Job.Status.COMPLETED,
            "a job woken after the children ran theirs",
            timeout=60,
        )
        assert cluster.poll() is None, cluster_log.read_text()
    finally:
        stop_process_group(cluster)
    text = cluster_log.read_text()
    assert Job.objects.filter(attempts__gt=1).count() == 0, text
    processes_of: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        process, backend = line.split()
        processes_of[backend].add(process)
    assert len({p for ps in processes_of.values() for p in ps}) == 2, processes_of  # both ran
    shared = {backend: ps for backend, ps in processes_of.items() if len(ps) > 1}
    assert shared == {}, shared  # no server session used by two processes
    warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    assert warnings == [], "\n".join(warnings)
