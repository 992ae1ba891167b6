"""Many jobs at once in one qcluster (issue 37): thread slots and the event loop.

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/slots.py [--blocking 1000] [--async-jobs 5000] [--workers 2] [--concurrency 50]

Two rounds, each against a fresh `manage.py qcluster` child (Q_WORKERS=2):

- `--blocking` jobs of `bench.block_1s` (`atomic=False`, `time.sleep(1)` in its thread),
  JOBS_CONCURRENCY=`--concurrency`: ideal `jobs / (workers * concurrency)` seconds; the
  issue's target is at most 1.5 times that (15 s for 1,000 jobs at 2 x 50);
- `--async-jobs` jobs of `bench.async_sleep_1s` (`await asyncio.sleep(1)`), the default
  JOBS_ASYNC_CONCURRENCY (500): target at most 15 s for 5,000.

The jobs are inserted in one transaction while the cluster runs (its wake-up starts them);
the time is from that commit to the last `completed_at`, on the database's clock. Each job
must have run once (`attempts = 1`). Prints the figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django_q.models import OrmQ  # noqa: E402

from bench.support import dsn_from_settings, ensure_database, stop_qcluster  # noqa: E402
from jobs.models import Job  # noqa: E402

INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
SELECT %s, '{}'::jsonb, 'queued', 0, 0, 3, now(), now(), '', '' FROM generate_series(1, %s)
"""


def start_qcluster(workers: int, extra: dict[str, str]) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        Q_WORKERS=str(workers),
        JOBS_EXTRA_HANDLER_MODULES="bench.handlers",
        PYTHONPATH=str(ROOT),
        LOG_LEVEL="WARNING",
        **extra,
    )
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "qcluster"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
        while not conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'jobs-wake-listener' "
            "AND datname = current_database()"
        ).fetchone():
            if cluster.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("qcluster did not start (is the database migrated?)")
            time.sleep(0.1)
    time.sleep(3)  # let the start-up runs of the schedules pass
    return cluster


def one_round(kind: str, jobs: int, workers: int, extra: dict[str, str]) -> tuple[float, int]:
    """Seconds from the insert's commit to the last completion; how many ran more than once."""
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    connection.close()  # the qcluster forks; nothing of ours should be open meanwhile
    cluster = start_qcluster(workers, extra)
    try:
        with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
            with conn.transaction():
                conn.execute(INSERT, [kind, jobs])
            committed = conn.execute("SELECT now()").fetchone()[0]
            deadline = time.monotonic() + 600
            while conn.execute(
                "SELECT count(*) FROM jobs_job WHERE status <> 'completed'"
            ).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{kind}: not done after 600 s")
                time.sleep(0.2)
            last, twice = conn.execute(
                "SELECT max(completed_at), count(*) FILTER (WHERE attempts > 1) FROM jobs_job"
            ).fetchone()
    finally:
        stop_qcluster(cluster)
    return (last - committed).total_seconds(), twice


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocking", type=int, default=1000, help="jobs blocking 1 s")
    parser.add_argument("--async-jobs", type=int, default=5000, help="async jobs of 1 s")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS")
    parser.add_argument("--concurrency", type=int, default=50, help="JOBS_CONCURRENCY (blocking)")
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)

    if args.blocking:
        ideal = args.blocking / (args.workers * args.concurrency)
        seconds, twice = one_round(
            "bench.block_1s",
            args.blocking,
            args.workers,
            {"JOBS_CONCURRENCY": str(args.concurrency)},
        )
        print(
            f"{args.blocking} jobs blocking 1 s, Q_WORKERS={args.workers} "
            f"JOBS_CONCURRENCY={args.concurrency}: {seconds:.1f} s "
            f"(ideal {ideal:.1f} s, {seconds / ideal:.2f}x; target <= 1.5x), "
            f"{twice} ran more than once"
        )
    if args.async_jobs:
        # The defaults: JOBS_CONCURRENCY=10 and JOBS_ASYNC_CONCURRENCY=500.
        slots = {"JOBS_CONCURRENCY": "10"}
        seconds, twice = one_round("bench.async_sleep_1s", args.async_jobs, args.workers, slots)
        print(
            f"{args.async_jobs} async jobs of asyncio.sleep(1), Q_WORKERS={args.workers}, "
            f"JOBS_CONCURRENCY=10, default JOBS_ASYNC_CONCURRENCY: {seconds:.1f} s "
            "(target <= 15 s), "
            f"{twice} ran more than once"
        )


if __name__ == "__main__":
    main()
