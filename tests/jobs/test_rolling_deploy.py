"""A rolling deploy (invariant I23, issue 31 point 1): the previous release's workers keep
draining jobs while this release's migrations are applied, then this release's workers take
over. No job errors, none is lost, none runs twice.

The previous release is a `git worktree` of an earlier commit, run with this venv (cwd and
PYTHONPATH the old checkout, so its code is what Python imports) against a database of its
own, named after the test database: the old code migrates it to its own schema first.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.support.processes import child_env, stop_process_group, wait_until
from tests.support.processes import test_database_url as database_url
from tests.support.releases import checkout, commit_before_adding, previous_release

pytestmark = [pytest.mark.slow]

KIND = "system.record"  # tests/system/handlers.py: one Message per run, in both releases
RUN_ID = "system-test-jobs"
DRAIN_TIMEOUT = 120  # seconds for a cluster to finish what it was given


def _insert_jobs(url: str, first: int, count: int) -> list[int]:
    """Plain SQL, as another producer writes them (both releases read these columns)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, jsonb_build_object('n', n), 'queued', 0, 0, 3, now(), now(), '', '' "
            "FROM generate_series(%s::int, %s::int) AS n RETURNING id",
            [KIND, first, first + count - 1],
        ).fetchall()
    return [row[0] for row in rows]


def _settled(url: str, ids: list[int]) -> bool:
    with psycopg.connect(url) as conn:
        (open_jobs,) = conn.execute(
            "SELECT count(*) FROM jobs_job WHERE id = ANY(%s) AND status IN ('queued', "
            "'processing')",
            [ids],
        ).fetchone()
    return open_jobs == 0


def _drained(url: str, ids: list[int], who: str, log: Path) -> None:
    """Wait until `ids` are done; on a timeout, fail with the cluster's log."""
    try:
        wait_until(lambda: _settled(url, ids), f"{who} drains its jobs", DRAIN_TIMEOUT)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None


def _manage(code: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{code.name}: manage.py {' '.join(args)}\n{done.stderr[-3000:]}"
    return done


@contextmanager
def _qcluster(code: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=code,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        stop_process_group(process)


@pytest.fixture
def deploy_database(django_db_setup, django_db_blocker) -> Iterator[str]:
    """An empty database named after the test database (each old release migrates its own)."""
    with django_db_blocker.unblock():
        test_name = connection.settings_dict["NAME"]
        prefix = "" if test_name.startswith("test_") else "test_"
        name = f"{prefix}{test_name}_deploy"[:63]
        base = database_url()
    admin_url = base.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(code: Path, url: str) -> dict[str, str]:
    return child_env(
        DATABASE_URL=url,
        PYTHONPATH=str(code),
        Q_WORKERS="2",
        JOBS_EXTRA_HANDLER_MODULES="tests.system.handlers",
        CANONICAL_IDS_ROLE="worker",
        LOG_LEVEL="INFO",
        INBOUND_EMAIL_STORE=str(code / "var" / "deploy-mail"),
    )


def _rolling_deploy(old_commit: str, url: str, tmp_path: Path) -> None:
    current = Path(__file__).resolve().parents[2]
    with checkout(old_commit, tmp_path / "previous") as old:
        old_env, new_env = _env(old, url), _env(current, url)
        _manage(old, old_env, "migrate", "--no-input")
        ids = _insert_jobs(url, 1, 40)
        with _qcluster(old, old_env, tmp_path / "previous.log") as old_cluster:
            _drained(url, ids[:10], "the previous release", tmp_path / "previous.log")
            ids += _insert_jobs(url, 41, 40)
            # This release's migrations while the old cluster drains.
            _manage(current, new_env, "migrate", "--no-input")
            after_migrate = _insert_jobs(url, 81, 40)
            ids += after_migrate
            _drained(url, ids, "the previous release", tmp_path / "previous.log")
            assert old_cluster.poll() is None, (tmp_path / "previous.log").read_text()[-3000:]
        with _qcluster(current, new_env, tmp_path / "current.log"):
            ids += _insert_jobs(url, 121, 40)
            _drained(url, ids, "this release", tmp_path / "current.log")
        old_log = (tmp_path / "previous.log").read_text()
    with psycopg.connect(url) as conn:
        statuses = dict(
            conn.execute(
                "SELECT status, count(*) FROM jobs_job WHERE id = ANY(%s) GROUP BY status", [ids]
            ).fetchall()
        )
        runs = conn.execute(
            "SELECT text, count(*) FROM canonical_ids_message WHERE run_id = %s GROUP BY text",
            [RUN_ID],
        ).fetchall()
        errors = conn.execute(
            "SELECT id, attempts, last_error FROM jobs_job WHERE id = ANY(%s) "
            "AND (attempts <> 1 OR last_error <> '')",
            [ids],
        ).fetchall()
        old_after_migrate = conn.execute(
            "SELECT count(*) FROM jobs_job WHERE id = ANY(%s) AND status = 'completed'",
            [after_migrate],
        ).fetchone()[0]
    assert statuses == {"completed": 160}, old_log[-4000:]
    assert errors == [], old_log[-4000:]
    assert sorted(runs) == sorted((f"job-{n}", 1) for n in range(1, 161))
    # The old release ran the jobs inserted after the new migrations, before any new worker.
    assert old_after_migrate == 40
    assert "Traceback" not in old_log, old_log[-4000:]


def test_previous_release_drains_while_this_release_migrates(deploy_database, tmp_path):
    """The previous release (the commit before the newest migration) across this deploy."""
    _rolling_deploy(previous_release(), deploy_database, tmp_path)


def test_release_before_runner_batches_drains_across_the_deploy(deploy_database, tmp_path):
    """Pinned: the release before jobs 0010, whose workers call jobs_finish_and_claim."""
    old = commit_before_adding("jobs/migrations/0010_runner_batches.py")
    _rolling_deploy(old, deploy_database, tmp_path)
