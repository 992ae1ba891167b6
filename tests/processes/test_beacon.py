"""Issue 20, point 1: real processes register, beat, say what they run, stop or go silent.

Before issue 20 nothing listed the running processes: an operator could not tell a worker
that runs a long job from one that died.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs import enqueue
from processes.models import WorkerProcess
from processes.selectors import processes_gone, processes_live
from processes.services import software_version
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _row(role: str, pid: int) -> WorkerProcess | None:
    return WorkerProcess.objects.filter(role=role, pid=pid).first()


def _status_json(capsys) -> dict:
    try:
        call_command("worker_status", "--json")
    except CommandError:
        pass  # the exit code is about findings, not processes
    return json.loads(capsys.readouterr().out)


def test_a_run_jobs_loop_is_live_with_its_current_job_and_stopped_after_sigterm(
    worker_env, tmp_path, capsys
):
    block = tmp_path / "block"
    block.touch()
    worker = spawn_manage_py("run_jobs", env=worker_env, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _row("run_jobs", worker.pid) is not None, "run_jobs registered")
        row = _row("run_jobs", worker.pid)
        assert (row.host, row.version) == (socket.gethostname(), software_version())
        assert processes_live().filter(pk=row.pk).exists()

        job = enqueue("tests.blocking", {"log": str(tmp_path / "log"), "block": str(block), "n": 1})
        wait_until(
            lambda: _row("run_jobs", worker.pid).current == f"job #{job.pk} tests.blocking",
            "the running job shown as the process's current work",
        )
        listed = {p["pid"]: p for p in _status_json(capsys)["processes"]}
        assert listed[worker.pid]["state"] == "live"
        assert listed[worker.pid]["current"] == f"job #{job.pk} tests.blocking"

        # A long job does not silence the process: it beats on its own thread.
        time.sleep(1.5)  # five beats
        assert processes_live().filter(pk=row.pk).exists()
        block.unlink()
        wait_until(lambda: _row("run_jobs", worker.pid).current == "", "idle again")
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output

    row = _row("run_jobs", worker.pid)
    assert row.stopped_at is not None  # a clean stop shows at once, not after 3 beats
    assert processes_gone().filter(pk=row.pk).exists()
    listed = {p["pid"]: p for p in _status_json(capsys)["processes"]}
    assert listed[worker.pid]["state"] == "stopped"


def test_a_killed_process_shows_as_gone_after_three_silent_beats(worker_env, capsys):
    worker = spawn_manage_py("run_jobs", env=worker_env)
    try:
        wait_until(lambda: _row("run_jobs", worker.pid) is not None, "run_jobs registered")
        row = _row("run_jobs", worker.pid)
        first_beat = row.heartbeat_at
        wait_until(lambda: _row("run_jobs", worker.pid).heartbeat_at > first_beat, "a beat")
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # no clean-up runs: only the silence tells
        worker.communicate(timeout=30)
    killed_at = time.monotonic()

    wait_until(lambda: not processes_live().filter(pk=row.pk).exists(), "gone", timeout=10)
    silent_for = time.monotonic() - killed_at
    assert silent_for < 0.3 * 3 + 1.0  # three 0.3 s intervals (plus the test's polling)
    row.refresh_from_db()
    assert row.stopped_at is None  # gone silent, not stopped
    listed = {p["pid"]: p for p in _status_json(capsys)["processes"]}
    assert listed[worker.pid]["state"] == "gone"


def test_a_qcluster_lists_itself_and_each_worker_process(worker_env, tmp_path):
    env = {**worker_env, "Q_WORKERS": "2"}
    with (tmp_path / "qcluster.log").open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(
            lambda: (
                processes_live().filter(role="qcluster", pid=cluster.pid).exists()
                and processes_live().filter(role="qcluster worker").count() == 2
            ),
            "the qcluster and its 2 worker processes registered",
            timeout=60,
        )
        workers = processes_live().filter(role="qcluster worker")
        worker_rows = [w.pk for w in workers]
        assert {w.pid for w in workers}.isdisjoint({cluster.pid})
        # The job runs until the test has seen it (a fixed 3 s job ended unseen once on a
        # loaded CI machine, where the beacon's write came late).
        seen = tmp_path / "seen"
        job = enqueue("tests.log", {"log": str(tmp_path / "log"), "n": 1, "until": str(seen)})
        try:
            wait_until(
                lambda: workers.filter(current=f"job #{job.pk} tests.log").exists(),
                "a worker process shows the job it runs",
                timeout=30,
                logs=(tmp_path / "qcluster.log",),
            )
        finally:
            seen.touch()
    finally:
        stop_process_group(cluster)
    wait_until(
        lambda: WorkerProcess.objects.get(role="qcluster", pid=cluster.pid).stopped_at,
        "the qcluster marked stopped",
    )
    # Issue 31.4: its worker processes leave the live list when they stop (marked stopped
    # as they exit), not only once their beats have been missing long enough.
    stopped = WorkerProcess.objects.filter(pk__in=worker_rows, stopped_at__isnull=False)
    assert stopped.count() == 2
