"""The functions the qcluster schedules call, and the wake-on-commit path through a real
qcluster."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from django_q.models import Task
from model_bakery import baker

from jobs import enqueue
from jobs.models import Job
from jobs.tasks import prune_completed_jobs, reap_stale_jobs, run_due_jobs
from ops.schedules import SCHEDULES
from tests.support.processes import (
    schedules_already_run,
    spawn_manage_py,
    stop_process_group,
    wait_until,
)


def test_every_jobs_schedule_points_at_a_function_here():
    import jobs.tasks

    paths = [spec.func for spec in SCHEDULES if spec.func.startswith("jobs.")]
    assert paths
    for path in paths:
        assert callable(getattr(jobs.tasks, path.rsplit(".", 1)[1]))


@pytest.mark.django_db
def test_run_due_jobs_and_reap_stale_jobs():
    enqueue("tests.noop")
    result = run_due_jobs()
    assert (result["claimed"], result["completed"]) == (1, 1)

    dead = timezone.now() - timedelta(minutes=5)
    baker.make(
        Job,
        kind="tests.noop",
        status=Job.Status.PROCESSING,
        attempts=1,
        max_attempts=2,
        heartbeat_at=dead,
        lease_expires_at=dead,
        locked_by="gone",
    )
    assert reap_stale_jobs() == 1
    assert reap_stale_jobs() == 0


@pytest.mark.django_db
def test_prune_deletes_only_completed_jobs_older_than_the_retention(settings):
    settings.JOBS_RETENTION_DAYS = 7
    old = timezone.now() - timedelta(days=8)
    recent = timezone.now() - timedelta(days=6)
    baker.make(
        Job,
        kind="k",
        status=Job.Status.COMPLETED,
        attempts=1,
        max_attempts=1,
        completed_at=old,
        _quantity=3,
    )
    keep = [
        baker.make(
            Job, kind="k", status="completed", attempts=1, max_attempts=1, completed_at=recent
        ),
        baker.make(Job, kind="k", status="failed", attempts=1, max_attempts=1, failed_at=old),
        baker.make(Job, kind="k", status="queued", max_attempts=1, created_at=old),
    ]

    assert prune_completed_jobs() == 3
    assert sorted(Job.objects.values_list("pk", flat=True)) == sorted(job.pk for job in keep)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_committed_while_the_cluster_runs_starts_within_seconds(worker_env, tmp_path):
    """The minute schedule alone would take up to 60 s; the on-commit wake-up makes it ~1 s."""
    log = tmp_path / "qcluster.log"
    env = {
        **worker_env,
        "Q_WORKERS": "1",
        "Q_POLL": "0.1",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
    }
    # No start-up run of the minute schedules: a run_due_jobs it queued and a loaded worker
    # ran late would start the job below instead of the wake-up.
    schedules_already_run()
    with log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        # The cluster runs once its wake-up listener is up (it connects last).
        while "jobs_job_due" not in log.read_text():
            assert cluster.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

        job = enqueue("tests.create_user", {"username": "woken"})  # commits: wake-up sent
        committed = time.monotonic()
        while Job.objects.get(pk=job.pk).status != Job.Status.COMPLETED:
            assert time.monotonic() - committed < 15, log.read_text()
            time.sleep(0.05)
        print(f"job completed {time.monotonic() - committed:.2f}s after commit")

        # ...and it was the wake-up task (not a schedule) that ran it.
        def wakeups():
            return [t.result for t in Task.objects.filter(name__startswith="jobs wake-up")]

        while not wakeups():
            assert time.monotonic() - committed < 15, log.read_text()
            time.sleep(0.05)
        assert wakeups()[0]["completed"] == 1
    finally:
        stop_process_group(cluster)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ten_quick_jobs_behind_a_slow_one_start_at_once_on_the_other_worker(worker_env, tmp_path):
    """Issue 22, head-of-line blocking: one job of 8 s and ten no-op jobs committed together
    with Q_WORKERS=2; the worker running the slow job holds none of the others, and the
    other worker starts every one of them within 2 s of the commit."""
    log = tmp_path / "qcluster.log"
    starts = tmp_path / "starts.log"
    env = {**worker_env, "Q_WORKERS": "2", "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}
    schedules_already_run()  # no start-up run of the schedules beside the eleven jobs
    with log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(lambda: "jobs_job_due" in log.read_text(), "the listener", timeout=60)
        with transaction.atomic():
            enqueue("tests.stamp_start", {"n": 0, "log": str(starts), "sleep": 8})
            for n in range(1, 11):
                enqueue("tests.stamp_start", {"n": n, "log": str(starts)})
        committed = time.time()
        wait_until(
            lambda: Job.objects.filter(status=Job.Status.COMPLETED).count() == 11,
            "all eleven jobs",
            timeout=60,
        )
    finally:
        stop_process_group(cluster)
    started = {
        int(n): float(t) - committed for n, t in map(str.split, starts.read_text().split("\n")[:-1])
    }
    assert sorted(started) == list(range(11))
    late = {n: round(wait, 2) for n, wait in started.items() if n and wait > 2}
    assert late == {}, f"no-op jobs started late (s after commit): {late}"
    # started_at is the handler's start, not the claim's: the no-ops were not held.
    for job in Job.objects.exclude(payload__n=0):
        assert (job.started_at - job.created_at).total_seconds() < 2.5
