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
