"""Issue 37, points 6 and 9, with real `run_jobs` processes and several slots busy: a thread
handler that never returns retires its process (it stops claiming, lets its other slots
finish and exits to be replaced, its job left `processing` until its lease runs out), and
SIGTERM stops claiming, gives the running slots JOBS_SHUTDOWN_GRACE_SECONDS, then asks them
to stop; a deploy's stop never re-runs a finished job and never leaves one `processing`
without a lease that will expire."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.utils import timezone

import tests.jobs.stop_handlers  # noqa: F401 - the kinds enqueued below
from jobs import enqueue
from jobs.models import Job, JobAttempt
from jobs.reaper import jobs_reap_stale
from tests.support.processes import killed_on_exit, spawn_manage_py, wait_until

# On the xdist workers, not `serial`: every wait is for a condition (a line in a file, the
# process's exit, the lease's end), no assertion is on a duration; five runs of this file on
# four workers beside two CPU-bound processes (load average 4-19) passed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(worker_env):
    worker_env["JOBS_EXTRA_HANDLER_MODULES"] = "tests.jobs.handlers,tests.jobs.stop_handlers"
    worker_env["JOBS_CONCURRENCY"] = "4"
    worker_env["JOBS_LINGER_SECONDS"] = "0"
    worker_env["JOBS_POLL_SECONDS"] = "0.1"
    return worker_env


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_thread_handler_that_never_returns_retires_its_process_not_its_other_jobs(env, tmp_path):
    env["JOBS_STOP_GRACE_SECONDS"] = "0.5"
    env["JOBS_LEASE_SECONDS"] = "3"
    env["JOBS_HEARTBEAT_SECONDS"] = "0.5"
    started, log = tmp_path / "started", tmp_path / "log"
    hung = enqueue("tests.stop.never_returns", {"started": str(started)}, priority=10)
    busy = [
        enqueue("tests.stop.slow_polite", {"n": n, "seconds": 3, "started": str(started),
                                            "log": str(log)}, priority=5)
        for n in range(2)
    ]  # fmt: skip
    with killed_on_exit(spawn_manage_py("run_jobs", env=env)) as worker:
        wait_until(lambda: len(_lines(started)) == 3, "three slots busy", timeout=30)
        out, err = worker.communicate(timeout=60)  # it exits by itself
    assert worker.returncode == 3, err
    assert "retiring this process" in err + out
    # Its other slots finished their jobs before it exited.
    assert sorted(_lines(log)) == ["finished 0", "finished 1"]
    for job in busy:
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED
    hung.refresh_from_db()
    assert hung.status == Job.Status.PROCESSING  # never re-queued while it could still run
    assert hung.lease_expires_at is not None
    wait_until(lambda: timezone.now() > hung.lease_expires_at, "the lease run out", timeout=20)
    assert [j.id for j in jobs_reap_stale()] == [hung.pk]
    hung.refresh_from_db()
    assert hung.status == Job.Status.QUEUED
    assert "timed out after 0.5 s" in JobAttempt.objects.get(job_id=hung.pk).error


def test_with_one_slot_a_handler_that_never_returns_retires_its_process_too(env, tmp_path):
    """JOBS_CONCURRENCY=1: the drain's own thread runs the handler, so its keeper gives back
    the batch's unstarted claims, leaves the hung job to the reaper and ends the process."""
    env.update(
        JOBS_CONCURRENCY="1",
        JOBS_STOP_GRACE_SECONDS="0.5",
        JOBS_LEASE_SECONDS="3",
        JOBS_HEARTBEAT_SECONDS="0.5",
    )
    started = tmp_path / "started"
    hung = enqueue("tests.stop.never_returns", {"started": str(started)}, priority=10)
    behind = [enqueue("tests.stop.quick", {"n": n}) for n in range(3)]
    with killed_on_exit(spawn_manage_py("run_jobs", env=env)) as worker:
        out, err = worker.communicate(timeout=60)  # it exits by itself
    assert worker.returncode == 3, err
    assert "retiring this process" in err + out
    for job in behind:  # given back unstarted, their attempt undone (or run meanwhile)
        job.refresh_from_db()
        assert job.status in (Job.Status.QUEUED, Job.Status.COMPLETED)
        assert job.locked_by == ""
    hung.refresh_from_db()
    assert hung.status == Job.Status.PROCESSING
    wait_until(lambda: timezone.now() > hung.lease_expires_at, "the lease run out", timeout=20)
    assert [j.id for j in jobs_reap_stale()] == [hung.pk]
    hung.refresh_from_db()
    assert "timed out after 0.5 s" in JobAttempt.objects.get(job_id=hung.pk).error


def test_sigterm_with_several_slots_busy_stops_them_and_never_reruns_a_finished_job(env, tmp_path):
    env["JOBS_SHUTDOWN_GRACE_SECONDS"] = "1"
    env["JOBS_STOP_GRACE_SECONDS"] = "10"
    started, log, quick = tmp_path / "started", tmp_path / "log", tmp_path / "quick"
    long = [
        enqueue(
            "tests.stop.slow_polite",
            {"n": n, "seconds": 30, "started": str(started), "log": str(log)},
            priority=5,
            max_attempts=n + 1,
        )
        for n in range(3)
    ]  # fmt: skip  (the first on its only attempt: a deploy must not fail it)
    done = [enqueue("tests.stop.quick", {"n": n, "log": str(quick)}) for n in range(5)]
    with killed_on_exit(spawn_manage_py("run_jobs", env=env)) as worker:
        wait_until(lambda: len(_lines(started)) == 3, "three slots busy", timeout=30)
        wait_until(lambda: len(_lines(quick)) == 5, "the quick jobs done", timeout=30)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
        later = enqueue("tests.stop.quick", {"n": 99, "log": str(quick)})
    assert worker.returncode == 0, err
    assert sorted(_lines(log)) == ["stopped 0", "stopped 1", "stopped 2"]
    for job in long:
        job.refresh_from_db()
        # Given back to run again at once, its attempt with it: the worker stopped, the job
        # did not fail (the one on its only attempt is not failed by a deploy).
        assert (job.status, job.locked_by, job.lease_expires_at) == (Job.Status.QUEUED, "", None)
        assert job.attempts == 0
        assert job.run_after <= timezone.now()
        assert "stopped" in JobAttempt.objects.get(job_id=job.pk).error
    for job in done:
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED
    assert sorted(_lines(quick)) == sorted(f"quick {n}" for n in range(5))  # each ran once
    later.refresh_from_db()
    assert later.attempts == 0
    assert not Job.objects.filter(status=Job.Status.PROCESSING).exists()


def test_sigterm_with_a_handler_that_ignores_the_stop_leaves_it_leased_and_exits(env, tmp_path):
    env["JOBS_SHUTDOWN_GRACE_SECONDS"] = "0.5"
    env["JOBS_STOP_GRACE_SECONDS"] = "0.5"
    env["JOBS_LEASE_SECONDS"] = "3"
    env["JOBS_HEARTBEAT_SECONDS"] = "0.5"
    started = tmp_path / "started"
    hung = enqueue("tests.stop.never_returns_long", {"started": str(started)})
    with killed_on_exit(spawn_manage_py("run_jobs", env=env)) as worker:
        wait_until(lambda: len(_lines(started)) == 1, "the handler running", timeout=30)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 3, err
    hung.refresh_from_db()
    assert hung.status == Job.Status.PROCESSING and hung.lease_expires_at is not None
    wait_until(lambda: timezone.now() > hung.lease_expires_at, "the lease run out", timeout=20)
    assert [j.id for j in jobs_reap_stale()] == [hung.pk]
    hung.refresh_from_db()
    assert (hung.status, hung.attempts) == (Job.Status.QUEUED, 1)


def _cluster_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "Q_WORKERS": "1", "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}


def test_a_qclusters_sigterm_reaches_its_drains_which_stop_their_busy_slots(env, tmp_path):
    """`docker stop` signals the qcluster's main process only: its drains, in the worker
    processes, stop claiming, give their running slots JOBS_SHUTDOWN_GRACE_SECONDS and then
    ask them to stop, so the cluster stops in seconds, not after JOBS_DRAIN_SECONDS."""
    from tests.jobs.test_wakeup import _qcluster

    env = _cluster_env(env)
    env["JOBS_SHUTDOWN_GRACE_SECONDS"] = "1"
    started, log, quick = tmp_path / "started", tmp_path / "log", tmp_path / "quick"
    with _qcluster(env, tmp_path / "qcluster.log") as cluster:
        long = [
            enqueue("tests.stop.slow_polite", {"n": n, "seconds": 120, "started": str(started),
                                                "log": str(log)}, priority=5)
            for n in range(3)
        ]  # fmt: skip
        wait_until(lambda: len(_lines(started)) == 3, "three slots busy", timeout=30)
        done = [enqueue("tests.stop.quick", {"n": n, "log": str(quick)}) for n in range(3)]
        wait_until(lambda: len(_lines(quick)) == 3, "the quick jobs done", timeout=30)
        cluster.send_signal(signal.SIGTERM)  # the leader only, as docker stop does
        cluster.wait(timeout=60)
    assert sorted(_lines(log)) == ["stopped 0", "stopped 1", "stopped 2"]
    for job in long:
        job.refresh_from_db()
        assert (job.status, job.locked_by) == (Job.Status.QUEUED, "")
    for job in done:
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED
    assert sorted(_lines(quick)) == [f"quick {n}" for n in range(3)]  # each ran once
    assert not Job.objects.filter(status=Job.Status.PROCESSING).exists()


def test_a_qcluster_worker_with_a_hung_handler_is_replaced(env, tmp_path):
    from tests.jobs.test_wakeup import _qcluster

    env = _cluster_env(env)
    env.update(JOBS_STOP_GRACE_SECONDS="0.5", JOBS_LEASE_SECONDS="3", JOBS_HEARTBEAT_SECONDS="0.5")
    started, log, pid_file = tmp_path / "started", tmp_path / "log", tmp_path / "pid"
    qlog = tmp_path / "qcluster.log"
    with _qcluster(env, qlog):
        hung = enqueue("tests.stop.never_returns", {"started": str(pid_file)}, priority=10)
        busy = enqueue("tests.stop.slow_polite", {"n": 0, "seconds": 2, "started": str(started),
                                                  "log": str(log)}, priority=5)  # fmt: skip
        wait_until(lambda: _lines(started) and _lines(pid_file), "two slots busy", timeout=30)
        wait_until(lambda: "retiring this process" in qlog.read_text(), "the worker retiring")
        pid = int(_lines(pid_file)[0])
        # The replacement takes new work; the hung handler's process is gone.
        later = enqueue("tests.stop.quick", {"n": 1, "log": str(log)})
        wait_until(
            lambda: Job.objects.get(pk=later.pk).status == Job.Status.COMPLETED,
            "a job started by the replacement worker",
            timeout=30,
        )
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), "the retired worker gone", timeout=20)
    busy.refresh_from_db()
    assert busy.status == Job.Status.COMPLETED
    hung.refresh_from_db()
    assert hung.status == Job.Status.PROCESSING
    wait_until(lambda: timezone.now() > hung.lease_expires_at, "the lease run out", timeout=20)
    assert [j.id for j in jobs_reap_stale()] == [hung.pk]


@pytest.mark.parametrize("command", [("run_jobs", "--burst"), ("qcluster",)])
def test_a_timeout_that_cannot_fit_inside_q_timeout_stops_the_start_naming_the_kind(env, command):
    env.update(Q_TIMEOUT="100", JOBS_DRAIN_SECONDS="80")  # 80 + 30 + 10 + 5 > 100
    with killed_on_exit(spawn_manage_py(*command, env=env)) as process:
        out, err = process.communicate(timeout=60)
    assert process.returncode == 1, out + err
    [line] = [line for line in err.splitlines() if "Q_TIMEOUT=100" in line]
    assert line.startswith("CommandError: configuration error: job kind 'tests.stop.")
    assert "Traceback" not in err
