"""scripts/test: a database of its own per run, dropped at the end; two runs in parallel pass."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from tests.support.processes import PROJECT_ROOT
from tests.support.processes import test_database_url as current_database_url
from tests.support.run_database import run_url

pytestmark = pytest.mark.slow


def test_run_url_gives_each_run_its_own_database_name():
    assert run_url("postgres://postgres@127.0.0.1:5432/w_boot", "42") == (
        "postgres://postgres@127.0.0.1:5432/w_boot_r42"
    )
    assert run_url("postgres://u:p@h:5432/db?sslmode=require", "7") == (
        "postgres://u:p@h:5432/db_r7?sslmode=require"
    )
    long_name = run_url("postgres://h/" + "x" * 80, "123456")
    assert len("test_" + long_name.rsplit("/", 1)[1]) <= 63


@pytest.mark.django_db
def test_two_runs_in_parallel_both_pass_and_drop_their_databases(tmp_path):
    server = current_database_url()  # the server this run uses, whatever its database
    env = dict(os.environ, TEST_DATABASE_URL=server, PROBE_DIR=str(tmp_path))
    env.pop("DATABASE_URL", None)
    runs = [
        subprocess.Popen(
            [str(PROJECT_ROOT / "scripts" / "test"), "-q", "-p", "no:cacheprovider"]
            + ["tests/support/parallel_probe.py"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]

    assert [run.returncode for run in runs] == [0, 0], "\n".join(outputs)
    names = sorted(path.read_text() for path in tmp_path.glob("*.name"))
    assert len(set(names)) == 2, names
    with psycopg.connect(server.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [names]
        ).fetchall()
    assert left == []
