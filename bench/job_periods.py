"""What the health page's per-kind trigger (ops_job_period, migration ops/0003) costs a job:
its claim and its completion, one transaction each as the runner does them, timed with the
trigger disabled and enabled, alternately, in this one process.

Usage (PostgreSQL; the database is created/migrated if needed; it adds and deletes its own
`trig.*` jobs, and leaves the trigger enabled):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/job_periods.py [--jobs 1500] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.support import dsn_from_settings, ensure_database  # noqa: E402

CLAIM = (
    "UPDATE jobs_job SET status = 'processing', attempts = 1, started_at = clock_timestamp(), "
    "locked_by = 'bench:1:a', lease_expires_at = now() + interval '1 minute' WHERE id = %s"
)
COMPLETE = (
    "UPDATE jobs_job SET status = 'completed', completed_at = clock_timestamp() WHERE id = %s"
)


def one_round(cur: psycopg.Cursor, *, enabled: bool, jobs: int) -> float:
    """Microseconds per job (claim + completion) with the trigger on or off."""
    cur.execute(f"ALTER TABLE jobs_job {'ENABLE' if enabled else 'DISABLE'} TRIGGER ops_job_period")
    cur.execute(
        "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
        "run_after, created_at, locked_by, last_error) SELECT 'trig.k' || (i %% 5), '{}', "
        "'queued', 0, 0, 1, now() - interval '5 s', now(), '', '' "
        "FROM generate_series(1, %s) AS i RETURNING id",
        [jobs],
    )
    ids = [row[0] for row in cur.fetchall()]
    started = time.perf_counter()
    for job_id in ids:
        cur.execute(CLAIM, [job_id])
        cur.execute(COMPLETE, [job_id])
    took = time.perf_counter() - started
    cur.execute("DELETE FROM jobs_job WHERE id = ANY(%s)", [ids])
    return took * 1e6 / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    times: dict[bool, list[float]] = {False: [], True: []}
    with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
        cur = conn.cursor()
        try:
            for _ in range(args.rounds):
                for enabled in (False, True):
                    times[enabled].append(one_round(cur, enabled=enabled, jobs=args.jobs))
        finally:
            cur.execute("ALTER TABLE jobs_job ENABLE TRIGGER ops_job_period")
            cur.execute("DELETE FROM ops_jobperiod WHERE kind LIKE 'trig.%%'")
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"{args.jobs} jobs x {args.rounds} rounds, claim + completion, one transaction each")
    print(
        f"  without ops_job_period (baseline) {off:7.0f} µs/job  {[round(t) for t in times[False]]}"
    )
    print(
        f"  with ops_job_period               {on:7.0f} µs/job  {[round(t) for t in times[True]]}"
    )
    print(f"  ratio {on / off:.2f} (+{on - off:.0f} µs/job)")


if __name__ == "__main__":
    main()
