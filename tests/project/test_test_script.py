"""scripts/test: a database of its own per run, dropped at the end; two runs in parallel pass;
under pytest-xdist each worker has its own database, and so do the processes its tests start."""

from __future__ import annotations

import json
import os
import subprocess

import psycopg
import pytest

from tests.support.processes import PROJECT_ROOT
from tests.support.processes import test_database_url as current_database_url
from tests.support.run_database import drop_test_database, run_databases, run_url

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


def test_the_drop_names_every_worker_database_of_the_run_and_no_other_run_s():
    existing = [
        "test_w_r12",
        "test_w_r12_gw0",
        "test_w_r12_gw11",
        "test_w_r12_gw0_deploy",
        "test_w_r12_deploy",
        "test_w_r123",  # another run, whose pid starts with this one's
        "test_w_r123_gw0",
        "test_w_r12_gwx",
        "w_r12",
    ]
    assert run_databases("w_r12", existing) == existing[:5]


@pytest.mark.django_db
def test_the_drop_removes_the_databases_a_killed_run_s_workers_left(tmp_path):
    server = current_database_url().rsplit("/", 1)[0]
    name = f"drop_probe_r{os.getpid()}"
    left = [f"test_{name}_gw0", f"test_{name}_gw1", f"test_{name}_gw1_deploy"]
    other = f"test_{name}0_gw0"  # run ..._r<pid>0: not this run's
    with psycopg.connect(server + "/postgres", autocommit=True) as conn:
        for database in [*left, other]:
            conn.execute(f'CREATE DATABASE "{database}"')
        try:
            drop_test_database(f"{server}/{name}")
            remaining = conn.execute(
                "SELECT datname FROM pg_database WHERE datname = ANY(%s) ORDER BY 1",
                [[*left, other]],
            ).fetchall()
        finally:
            for database in [*left, other]:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
    assert remaining == [(other,)]


@pytest.mark.django_db
def test_each_xdist_worker_and_the_processes_it_starts_use_the_worker_s_own_database(tmp_path):
    server = current_database_url()
    env = dict(os.environ, TEST_DATABASE_URL=server, PROBE_DIR=str(tmp_path))
    for inherited in ("DATABASE_URL", "INBOUND_EMAIL_STORE", "PYTEST_XDIST_WORKER"):
        env.pop(inherited, None)
    run = subprocess.run(
        [str(PROJECT_ROOT / "scripts" / "test"), "-q", "-p", "no:cacheprovider"]
        + ["-n", "2", "--dist", "each", "tests/support/xdist_probe.py"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    seen = {path.stem: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    assert sorted(seen) == ["gw0", "gw1"]
    for worker, probe in seen.items():
        assert probe["database"].endswith(f"_{worker}"), probe
        assert probe["child_database"] == probe["database"]
        assert probe["store"].endswith(f"inbound_mail_{worker}"), probe
        assert probe["child_store"] == probe["store"]
    with psycopg.connect(server.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)",
            [[probe["database"] for probe in seen.values()]],
        ).fetchall()
    assert left == []
