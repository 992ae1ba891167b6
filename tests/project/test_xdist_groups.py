"""The tests of one `xdist_group` run on one worker under `--dist loadgroup`
(tests/support/xdist_groups.py): pytest 9.2 with pytest-xdist 3.8 spread them silently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_the_tests_of_one_group_run_on_one_worker(tmp_path):
    env = dict(os.environ, PROBE_DIR=str(tmp_path))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        + ["-n", "2", "--dist", "loadgroup", "tests/support/group_probe.py"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert len(workers) == 16, workers
    grouped = {workers[f"grouped-{n}"] for n in range(8)}
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}"
    # The others are still spread: both workers ran tests.
    assert set(workers.values()) == {"gw0", "gw1"}, workers
