"""What the benchmark scripts share: the database they measure, and a statement counter.

The scripts run as files: each puts the project root on sys.path, then imports this.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection

# The tables the job triggers count into (issue 32: append-only deltas and their rollups).
COUNTER_TABLES = (
    "jobs_jobcount",
    "jobs_jobcountdelta",
    "ops_metricseries",
    "ops_metricdelta",
    "ops_jobperiod",
    "ops_jobperioddelta",
)


def setup_django_like_production() -> None:
    """Django set up as the image runs it (DEBUG=false): with DEBUG on, Django's debug cursor
    times and records every query, which alone cost the runner about a quarter of its speed.
    A qcluster child started by the script inherits the same environment."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DEBUG", "false")
    if os.environ["DEBUG"].lower() in {"false", "0", "no", "off"}:
        os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 40)
    django.setup()


def dsn_from_settings() -> str:
    """The settings' database as a libpq connection string (for the bare psycopg loops)."""
    params = connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=params["NAME"],
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=params.get("PORT") or None,
    )


def ensure_database() -> None:
    """Create the benchmark database on first use (each script's docstring promises it)."""
    name = connection.settings_dict["NAME"]
    maintenance = psycopg.conninfo.make_conninfo(dsn_from_settings(), dbname="postgres")
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


@contextmanager
def counting_statements() -> Iterator[list[int]]:
    """Count the SQL statements Django sends inside the block: `with ... as count:`, then
    `count[0]`."""
    count = [0]

    def wrapper(execute, sql, params, many, context):
        count[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield count


def stop_qcluster(cluster: subprocess.Popen) -> None:
    """Stop a qcluster child started in a session of its own (SIGINT, then SIGKILL)."""
    os.killpg(cluster.pid, signal.SIGINT)
    try:
        cluster.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()
