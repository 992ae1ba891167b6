"""Claim churn on a mixed workload: claims and give-backs per job (issue 29, point 3).

Usage (PostgreSQL; the database is created/migrated if needed and its job tables emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/claim_churn.py [--jobs 3000] [--workers 3] [--no-warm-up]

`--workers` processes of `manage.py run_jobs --burst` drain `--jobs` jobs in random order:
50 % no-ops (`bench.noop`), 40 % of 20 ms (`bench.quick`), 10 % of 200 ms (`bench.slow`),
all of the default kind (not declared idempotent). Each process prints its drain's summary;
this sums them and prints claims per job (every row a claim took, counting a job claimed
again after a give-back) and give-backs per job (goals: at most 1.2 and 0.1), and the wall
time against the ideal (the work divided by the processes). First, unless `--no-warm-up`,
60 jobs of the same mix run, so the per-kind durations the claim reads (ops_jobperiod,
through jobs.kind_durations.job_kinds_slower_than) know the kinds, as they would in production;
a cold run (`--no-warm-up`) shows what the first half-minute of a fresh database costs.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.support import ensure_database  # noqa: E402

MIX = (("bench.noop", 0.5, 0.0), ("bench.quick", 0.4, 0.02), ("bench.slow", 0.1, 0.2))
SUMMARY = re.compile(r"claimed=(\d+) completed=(\d+) .* released=(\d+)")


def fill(count: int, seed: int) -> float:
    """Queue `count` jobs of the mix in random order; return their total work in seconds."""
    rng = random.Random(seed)
    kinds = [kind for kind, share, _s in MIX for _ in range(round(count * share))][:count]
    rng.shuffle(kinds)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts,
                                  run_after, created_at, locked_by, last_error)
            SELECT k, '{}'::jsonb, 'queued', 0, 0, 5, now(), now(), '', ''
            FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, n) ORDER BY n
            """,
            [kinds],
        )
    seconds = {kind: s for kind, _share, s in MIX}
    return sum(seconds[kind] for kind in kinds)


def drain(workers: int) -> tuple[int, int, int, float]:
    """Run `workers` burst drains at once; return claimed, completed, released, wall time."""
    env = {
        **os.environ,
        "JOBS_EXTRA_HANDLER_MODULES": "bench.handlers",
        "PYTHONPATH": str(ROOT),
    }
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_jobs", "--burst"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    claimed = completed = released = 0
    for process in processes:
        out, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise SystemExit(f"run_jobs failed:\n{err}")
        for match in SUMMARY.finditer(out):
            claimed += int(match[1])
            completed += int(match[2])
            released += int(match[3])
    return claimed, completed, released, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--no-warm-up", action="store_true")
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobattempt, ops_jobperiod")
    if not args.no_warm_up:
        fill(60, seed=1)
        drain(args.workers)
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs_job, jobs_jobattempt")
    work = fill(args.jobs, seed=2)
    claimed, completed, released, wall = drain(args.workers)
    ideal = work / args.workers
    print(
        f"{args.jobs} jobs (50 % no-op, 40 % 20 ms, 10 % 200 ms), {args.workers} run_jobs "
        f"--burst, {'cold' if args.no_warm_up else 'warm'}: completed {completed}"
    )
    print(f"  claims per job:     {claimed / args.jobs:.2f}  (goal <= 1.2)")
    print(f"  give-backs per job: {released / args.jobs:.2f}  (goal <= 0.1)")
    print(f"  wall {wall:.1f} s, ideal {ideal:.1f} s ({wall / ideal:.2f}x; start-up included)")
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobattempt")


if __name__ == "__main__":
    main()
