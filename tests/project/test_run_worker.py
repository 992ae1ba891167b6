"""One worker per var/ (issue 31, point 4): a second `scripts/run-worker` on the same var/
said nothing and started a second full worker. Now it names the processes holding the var/
and exits non-zero; once the first has stopped, the var/ is free again. Issue 36, point 3:
the var/ stays claimed while any process of the worker runs, whatever was killed.

On the test database (DATABASE_URL set: nothing embedded is started, the demo never runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.processes import PROJECT_ROOT, stop_process_group

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _run_worker(env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [str(PROJECT_ROOT / "scripts" / "run-worker")],
        cwd=PROJECT_ROOT,
        env=env,
        start_new_session=True,
        **kwargs,
    )


def test_a_second_run_worker_on_the_same_var_names_the_first_and_exits(
    subprocess_env, tmp_path: Path
):
    var_dir = tmp_path / "var"
    env = {**subprocess_env, "WORKER_VAR_DIR": str(var_dir), "Q_WORKERS": "1"}
    env["INBOUND_EMAIL_STORE"] = str(var_dir / "mail")
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = _run_worker(env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240  # a first run may install the venv's extras
        while "Q Cluster" not in log.read_text() or "running" not in log.read_text():
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        second = _run_worker(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = second.communicate(timeout=120)
        finally:
            stop_process_group(second)  # on main it started a second worker, which ran on
        assert second.returncode == 1, stderr
        holding = _in_session(first.pid)  # run-worker, its qcluster and the qcluster's workers
        assert first.pid in holding and len(holding) > 2
        assert stderr.strip().splitlines()[-1] == _refusal(var_dir, holding, first.pid)
        assert "Q Cluster" not in stdout + stderr  # no second worker started
        assert (var_dir / "worker.pid").read_text().split() == [str(first.pid)]
    finally:
        stop_process_group(first, timeout=60)
    assert not (var_dir / "worker.pid").exists()  # released on stop: the var/ is free


def _refusal(var_dir: Path, holding: list[int], stop: int) -> str:
    many = len(holding) > 1
    return (
        f"run-worker: a worker already runs on {var_dir} (pid{'s' if many else ''} "
        f"{', '.join(map(str, sorted(holding)))} hold{'' if many else 's'} "
        f"{var_dir / 'worker.lock'}); stop it first (Ctrl-C in its terminal, or kill {stop}), "
        "or give this one another WORKER_VAR_DIR"
    )


def _stat(pid: int) -> list[str] | None:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _in_session(session_id: int) -> list[int]:
    """The pids of live processes in session `session_id` (run-worker's, from its start)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and fields[0] != "Z" and int(fields[3]) == session_id:
            found.append(int(entry.name))
    return sorted(found)


def test_kill_of_run_worker_alone_stops_its_worker_too(subprocess_env, tmp_path: Path):
    """`kill <pid>` of run-worker, as the refusal above tells an operator to do (and a
    supervisor that signals only its child), reached the script alone: it ran its exit
    trap (on the embedded default: the database stopped) and left qcluster running on,
    its loops failing without a database. The script passes TERM on and waits."""
    var_dir = tmp_path / "var"
    env = {**subprocess_env, "WORKER_VAR_DIR": str(var_dir), "Q_WORKERS": "1"}
    env["INBOUND_EMAIL_STORE"] = str(var_dir / "mail")
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = _run_worker(env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240  # a first run may install the venv's extras
        while "job wake-up listener connected" not in log.read_text():
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        worker.terminate()  # SIGTERM to the script's pid only
        worker.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _in_session(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _in_session(worker.pid)
    finally:
        stop_process_group(worker, timeout=30)
    assert left == [], f"still running after run-worker exited: {left}\n{log.read_text()[-3000:]}"
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert not (var_dir / "worker.pid").exists()


def _wait_for_log(process: subprocess.Popen, log: Path, *needles: str) -> None:
    deadline = time.monotonic() + 240  # a first run may install the venv's extras
    while not all(needle in log.read_text() for needle in needles):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def _second_run_worker(env: dict[str, str], log: Path) -> tuple[int, str]:
    """Start another run-worker on the var/; its exit status and output once it has exited,
    or a failure as soon as it starts a Q Cluster (a second worker on the var/)."""
    with log.open("w") as out:
        second = _run_worker(env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while second.poll() is None:
            assert "Q Cluster" not in log.read_text(), f"a second worker:\n{log.read_text()}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        stop_process_group(second)
    return second.returncode, log.read_text()


def test_a_kill_9_of_run_worker_alone_leaves_the_var_claimed_until_its_worker_is_gone(
    subprocess_env, tmp_path: Path
):
    """`kill -9` of the script (the pid a refusal used to name; an OOM kill; a supervisor that
    kills only its child) left its qcluster running on the var/, and the var/'s claim was the
    dead script's pid: a second run-worker took the var/ and started a second qcluster beside
    the first. The claim is a flock the qcluster inherits: the second one refuses, naming the
    processes left and the qcluster to stop. Once they are killed too, a start succeeds."""
    var_dir = tmp_path / "var"
    env = {**subprocess_env, "WORKER_VAR_DIR": str(var_dir), "Q_WORKERS": "1"}
    env["INBOUND_EMAIL_STORE"] = str(var_dir / "mail")
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = _run_worker(env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_log(first, log, "Q Cluster", "running")
        os.kill(first.pid, signal.SIGKILL)  # the script alone
        first.wait(timeout=10)
        left = _in_session(first.pid)
        assert left, "the qcluster stopped with its script: nothing to test"
        [qcluster] = [pid for pid in left if int(_stat(pid)[1]) not in left]
        assert b"qcluster" in Path(f"/proc/{qcluster}/cmdline").read_bytes()

        status, output = _second_run_worker(env, tmp_path / "second.log")
        assert status == 1, output
        assert output.strip().splitlines()[-1] == _refusal(var_dir, left, qcluster)
        assert _in_session(first.pid) == left  # the refusal touched nothing that runs

        os.killpg(first.pid, signal.SIGKILL)  # everything: the var/ is free at once
        deadline = time.monotonic() + 30
        while _in_session(first.pid):
            assert time.monotonic() < deadline, _in_session(first.pid)
            time.sleep(0.2)
        third_log = tmp_path / "third.log"
        with third_log.open("w") as out:
            third = _run_worker(env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_for_log(third, third_log, "Q Cluster", "running")
            assert (var_dir / "worker.pid").read_text().split() == [str(third.pid)]
            third.terminate()  # `kill N`, as the refusal says: passed on to its qcluster
            third.wait(timeout=60)
            deadline = time.monotonic() + 30
            while _in_session(third.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _in_session(third.pid) == [], third_log.read_text()[-3000:]
        finally:
            stop_process_group(third, timeout=30)
        assert "Traceback" not in third_log.read_text(), third_log.read_text()[-3000:]
    finally:
        stop_process_group(first, timeout=30)
    assert not (var_dir / "worker.pid").exists()
