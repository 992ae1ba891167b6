"""One worker per var/ (issue 31, point 4): a second `scripts/run-worker` on the same var/
said nothing and started a second full worker. Now it names the running one's pid and exits
non-zero; once the first has stopped, the var/ is free again.

On the test database (DATABASE_URL set: nothing embedded is started, the demo never runs).
"""

from __future__ import annotations

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
        assert stderr.strip().splitlines()[-1] == (
            f"run-worker: a worker already runs on {var_dir} (run-worker pid {first.pid}); "
            f"stop it first (Ctrl-C in its terminal, or kill {first.pid}), or give this one "
            "another WORKER_VAR_DIR"
        )
        assert "Q Cluster" not in stdout + stderr  # no second worker started
        assert (var_dir / "worker.pid").read_text().split() == [str(first.pid)]
    finally:
        stop_process_group(first, timeout=60)
    assert not (var_dir / "worker.pid").exists()  # released on stop: the var/ is free


def _in_session(session_id: int) -> list[int]:
    """The pids of live processes in session `session_id` (run-worker's, from its start)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == session_id:
            found.append(int(entry.name))
    return found


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
