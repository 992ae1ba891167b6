"""Chaos soak: two qclusters under random faults for a while, then the invariants checked.

Usage (PostgreSQL; the database named in DATABASE_URL is DROPPED and re-created, so its
name must contain "soak"):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_soak .venv/bin/python bench/soak.py \
        600 [--seed 1] [--fault-interval 2.5] [--quiet-timeout 900] [--workdir var/soak]

The first argument is the duration of the fault window in seconds. The scenario (shared with
tests/system/test_chaos.py, which runs it for 40 s in CI) is in tests/support/chaos.py: two
`manage.py qcluster` processes with moto S3/SES (server mode) and the local Slack server;
SIGKILL of workers holding a job, `pg_terminate_backend` of a cluster's sessions, Slack
answering 429/500/slowly; jobs from Django and from plain SQL, mails, sweeps. It prints the
fault counts and the invariant checks as a table and exits non-zero if an invariant failed.
The clusters' logs are left in the work directory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from tests.support.chaos import ChaosRun, ChaosSettings  # noqa: E402
from tests.support.processes import test_database_url  # noqa: E402


def recreate_database() -> None:
    """A clean database per soak: every row the checks count was made by this run."""
    name = connection.settings_dict["NAME"]
    if "soak" not in name:
        sys.exit(f"bench/soak.py drops its database; {name!r} must contain 'soak'")
    connections.close_all()
    maintenance = psycopg.conninfo.make_conninfo(
        test_database_url().replace(f"/{name}", "/postgres")
    )
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("seconds", type=float, help="length of the fault window")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-interval", type=float, default=2.5, help="mean s between faults")
    parser.add_argument("--quiet-timeout", type=float, default=900.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/soak.py needs PostgreSQL: set DATABASE_URL=postgres://.../worker_soak")
    # SIGTERM (and SIGINT, which a background job may ignore) unwind through the run's
    # clean-up, so the two clusters are stopped with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    recreate_database()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.seconds:.0f} s of faults, seed {args.seed}, logs in {workdir}", flush=True)
    started = time.monotonic()
    report = ChaosRun(
        ChaosSettings(
            seconds=args.seconds,
            quiet_timeout=args.quiet_timeout,
            seed=args.seed,
            fault_interval=args.fault_interval,
        ),
        workdir,
    ).run()
    print(report.table())
    print(f"\nwall time {time.monotonic() - started:.0f} s")
    sys.exit(1 if report.failed or not report.settled else 0)


if __name__ == "__main__":
    main()
