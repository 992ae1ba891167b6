"""I4 / COR-18: rows orphaned in `processing` are reclaimed by an idempotent reaper."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from model_bakery import baker

from jobs import enqueue
from jobs.models import Job
from jobs.reaper import jobs_reap_stale
from tests.support.processes import manage_py, spawn_manage_py

User = get_user_model()


def _orphan(**fields) -> Job:
    """A row left `processing` by a worker that died a minute ago."""
    dead = timezone.now() - timedelta(minutes=1)
    defaults = {
        "kind": "tests.noop",
        "status": Job.Status.PROCESSING,
        "attempts": 1,
        "max_attempts": 3,
        "started_at": dead,
        "heartbeat_at": dead,
        "lease_expires_at": dead + timedelta(seconds=30),
        "locked_by": "deadhost:123:abcd",
    }
    defaults.update(fields)
    return baker.make(Job, **defaults)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.mark.django_db
def test_orphan_is_requeued_with_backoff_and_the_attempt_counted(capsys):
    """COR-18: the old worker wrote started_at but nothing read it; an orphan stayed forever."""
    orphan = _orphan()
    alive = _orphan(lease_expires_at=timezone.now() + timedelta(minutes=1), locked_by="alive")

    before = timezone.now()
    call_command("reap_stale")

    assert "reaped 1 job(s)" in capsys.readouterr().out
    orphan.refresh_from_db()
    assert orphan.status == Job.Status.QUEUED
    assert orphan.attempts == 1  # counted at claim; the reap does not add another
    assert orphan.run_after >= before + timedelta(seconds=settings.JOBS_BACKOFF_BASE_SECONDS)
    assert orphan.locked_by == "" and orphan.lease_expires_at is None
    assert orphan.last_error.startswith("reaped at")
    assert "deadhost:123:abcd stopped heartbeating" in orphan.last_error
    alive.refresh_from_db()
    assert alive.status == Job.Status.PROCESSING


@pytest.mark.django_db
def test_reaping_the_last_attempt_fails_the_job():
    orphan = _orphan(attempts=3, max_attempts=3)

    assert [job.status for job in jobs_reap_stale()] == [Job.Status.FAILED]

    orphan.refresh_from_db()
    assert orphan.status == Job.Status.FAILED
    assert orphan.failed_at is not None and orphan.completed_at is None
    assert orphan.attempts == 3


@pytest.mark.django_db
def test_dry_run_changes_nothing_and_older_than_uses_the_last_heartbeat(capsys):
    orphan = _orphan()
    recent = _orphan(
        heartbeat_at=timezone.now() - timedelta(seconds=5),
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )
    before = list(Job.objects.order_by("pk").values())

    call_command("reap_stale", "--dry-run")
    out = capsys.readouterr().out
    assert "would reap 1 job(s)" in out and f"#{orphan.pk} tests.noop" in out
    call_command("reap_stale", "--dry-run", "--older-than", "2", "--force")
    assert "would reap 2 job(s)" in capsys.readouterr().out
    assert list(Job.objects.order_by("pk").values()) == before

    call_command("reap_stale", "--older-than", "2", "--force")
    assert "reaped 2 job(s)" in capsys.readouterr().out
    recent.refresh_from_db()
    assert recent.status == Job.Status.QUEUED


@pytest.mark.django_db
def test_older_than_below_the_lease_is_refused_without_force(settings, capsys):
    """Review defect: `reap_stale --older-than S` accepted S below the lease (and the
    heartbeat interval), then reaped jobs whose worker was alive: their work rolled back
    and their side effects ran again. Such an S is now refused unless `--force`."""
    settings.JOBS_LEASE_SECONDS = 30
    settings.JOBS_HEARTBEAT_SECONDS = 7.5
    live = _orphan(
        heartbeat_at=timezone.now() - timedelta(seconds=12),  # one beat late, lease still valid
        lease_expires_at=timezone.now() + timedelta(seconds=18),
        locked_by="alive:1:beef",
    )
    before = list(Job.objects.values())

    for args in (["--older-than", "10"], ["--older-than", "29.9", "--dry-run"]):
        with pytest.raises(CommandError, match=r"below JOBS_LEASE_SECONDS=30.*--force"):
            call_command("reap_stale", *args)
    assert list(Job.objects.values()) == before

    call_command("reap_stale", "--older-than", "30")  # at the lease: allowed, reaps nothing
    assert "reaped 0 job(s)" in capsys.readouterr().out

    call_command("reap_stale", "--older-than", "10", "--force")
    assert "reaped 1 job(s)" in capsys.readouterr().out
    live.refresh_from_db()
    assert live.status == Job.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_two_reapers_at_once_reap_each_row_exactly_once():
    orphans = [_orphan() for _ in range(400)]
    results: list[list[int]] = [[], []]
    start = threading.Barrier(2)

    def reap(slot: int) -> None:
        try:
            start.wait()
            results[slot] = [job.id for job in jobs_reap_stale()]
        finally:
            connection.close()

    threads = [threading.Thread(target=reap, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    first, second = results
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(job.pk for job in orphans)
    assert set(Job.objects.values_list("status", "attempts")) == {(Job.Status.QUEUED, 1)}
    assert jobs_reap_stale() == []  # idempotent: nothing left to reap


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigkilled_worker_row_is_reaped_after_its_lease_then_completes_once(worker_env, tmp_path):
    """kill -9 mid-job: the row stays `processing` (nothing can record it); while the worker
    lived its heartbeat kept the lease; after the lease runs out `reap_stale` reclaims it
    (`--dry-run` first changes nothing) and the next worker completes it exactly once."""
    log, block = tmp_path / "runs.log", tmp_path / "block"
    block.touch()
    job = baker.make(
        Job,
        kind="tests.blocking",
        payload={"n": 1, "log": str(log), "block": str(block)},
        max_attempts=3,
    )
    lease = {"JOBS_LEASE_SECONDS": "2", "JOBS_HEARTBEAT_SECONDS": "0.25"}
    worker = spawn_manage_py("run_jobs", "--burst", env={**worker_env, **lease})
    try:
        _wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "the job to start")
        time.sleep(2.5)  # longer than the lease: only the heartbeat keeps the row alive
        alive = manage_py("reap_stale", "--dry-run", env=worker_env, timeout=60)
        assert "would reap 0 job(s)" in alive.stdout, alive.stdout + alive.stderr
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    block.unlink()

    job.refresh_from_db()
    assert job.status == Job.Status.PROCESSING and job.attempts == 1
    time.sleep(2.2)  # let the dead worker's lease run out

    before = list(Job.objects.values())
    dry = manage_py("reap_stale", "--dry-run", env=worker_env, timeout=60)
    assert f"would reap 1 job(s)\n  #{job.pk} tests.blocking attempts 1/3" in dry.stdout, (
        dry.stdout + dry.stderr
    )
    assert list(Job.objects.values()) == before

    reap = manage_py("reap_stale", env={**worker_env, "JOBS_BACKOFF_BASE_SECONDS": "0"}, timeout=60)
    assert "reaped 1 job(s)" in reap.stdout, reap.stdout + reap.stderr
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and job.attempts == 1

    rerun = manage_py("run_jobs", "--burst", env=worker_env, timeout=60)
    assert "claimed=1 completed=1" in rerun.stdout, rerun.stdout + rerun.stderr
    job.refresh_from_db()
    assert job.status == Job.Status.COMPLETED and job.attempts == 2
    assert job.completed_at is not None and job.failed_at is None
    lines = log.read_text().split()
    assert lines.count("start") == 2 and lines.count("done") == 1
    assert User.objects.filter(username="done-1").count() == 1


@pytest.mark.usefixtures("one_slot")
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigterm_finishes_the_running_job_and_gives_back_unstarted_claims(worker_env, tmp_path):
    log, block = tmp_path / "runs.log", tmp_path / "block"
    block.touch()
    running = enqueue("tests.blocking", {"n": 2, "log": str(log), "block": str(block)}, priority=9)
    waiting = [enqueue("tests.noop") for _ in range(3)]
    worker = spawn_manage_py("run_jobs", env=worker_env)  # not --burst: polls until stopped
    try:
        _wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "the job to start")
        # Issue 22: the batch's jobs behind a long one go back to the queue at once (after
        # JOBS_HOLD_UNSTARTED_SECONDS), for an idle worker: only the job that runs is held.
        _wait_for(
            lambda: Job.objects.filter(status=Job.Status.PROCESSING).count() == 1,
            2,
            "the unstarted claims given back",
        )
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        block.unlink()
        out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    assert worker.returncode == 0, err
    assert "SIGTERM: stopped" in out
    running.refresh_from_db()
    assert running.status == Job.Status.COMPLETED
    for job in waiting:
        job.refresh_from_db()
        assert (job.status, job.attempts, job.locked_by) == (Job.Status.QUEUED, 0, "")
