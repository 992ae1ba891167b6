"""Due-time wake-ups: how long after its run_after a job starts, for run_after 0.2-30 s ahead.

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/due_wakeups.py [--jobs 60] [--workers 2]

Starts `manage.py qcluster` (with its wake-up listener), moves the minute schedule of
`run_due_jobs` an hour away (so only the wake-up can start a job), then inserts no-op jobs
due 0.2-30 s ahead, spread over the run, alternately by a plain SQL `INSERT` and by
Django's `enqueue()`. A job's wait is `started_at - run_after`, both on the database's
clock. Target (issue 22): p95 < 1 s in every band.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django_q.models import OrmQ, Schedule  # noqa: E402

from bench.latency import KIND, start_qcluster, stop_qcluster  # noqa: E402
from bench.support import dsn_from_settings, ensure_database  # noqa: E402
from jobs import enqueue  # noqa: E402
from jobs.models import Job  # noqa: E402
from project.db_clock import db_now  # noqa: E402

SQL_INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
VALUES (%s, '{"run": "due"}', 'queued', 0, 0, 3, clock_timestamp() + make_interval(secs => %s),
        clock_timestamp(), '', '')
"""
BANDS = [(0.2, 1.0), (1.0, 5.0), (5.0, 30.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=60, help="jobs in all (default 60)")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS of the qcluster")
    parser.add_argument("--seed", type=int, default=22)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    ensure_database()
    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    connection.close()  # the qcluster forks; nothing of ours should be open meanwhile

    cluster = start_qcluster(args.workers)
    try:
        Schedule.objects.filter(func="jobs.tasks.run_due_jobs").update(
            next_run=db_now() + timedelta(hours=1)
        )
        conn = psycopg.connect(dsn_from_settings(), autocommit=True)
        for n in range(args.jobs):
            low, high = BANDS[n % len(BANDS)]
            ahead = rng.uniform(low, high)
            if n % 2:
                conn.execute(SQL_INSERT, [KIND, ahead])
            else:
                enqueue(KIND, {"run": "due"}, run_after=db_now() + timedelta(seconds=ahead))
            time.sleep(rng.uniform(0, 0.5))
        conn.close()
        deadline = time.monotonic() + 120
        rows = Job.objects.filter(kind=KIND)
        while rows.exclude(status=Job.Status.COMPLETED).exists():
            if time.monotonic() > deadline:
                raise SystemExit("jobs did not complete within 120 s of the last insert")
            time.sleep(0.2)
        waits = [
            ((run_after - created).total_seconds(), (started - run_after).total_seconds())
            for run_after, created, started in rows.values_list(
                "run_after", "created_at", "started_at"
            )
        ]
    finally:
        stop_qcluster(cluster)
        Job.objects.filter(kind=KIND).delete()

    print(
        f"wait from run_after to start, qcluster with {args.workers} workers, minute schedule "
        f"off, {len(waits)} jobs (target: p95 < 1 s)"
    )
    print(f"  {'due ahead':<12}{'jobs':>6}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}")
    for low, high in BANDS:
        band = sorted(wait for ahead, wait in waits if low <= ahead < high + 0.05)
        if len(band) < 2:
            continue
        p95 = statistics.quantiles(band, n=20)[18]
        print(
            f"  {f'{low:g}-{high:g} s':<12}{len(band):6d}{statistics.median(band) * 1000:9.0f}"
            f"{p95 * 1000:9.0f}{band[-1] * 1000:9.0f}"
        )


if __name__ == "__main__":
    main()
