#!/usr/bin/env python
"""Bulk enqueue against one job at a time (issue 38, point 7): `jobs.enqueue_many` of
100,000 jobs in one statement (target: at most 2 s) against 100,000 `jobs.enqueue` calls, in
the same run, on a throwaway test_<name> database (created and dropped).

Usage (from the project root):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/enqueue_many.py
    .venv/bin/python bench/enqueue_many.py --jobs 100000 [--keys] [--rounds 3]

Each round: enqueue_many of `--jobs` payloads in one transaction (committed), the table
emptied (TRUNCATE), then `--jobs` enqueue calls in one transaction (committed: one commit,
so the single calls are measured at their best), the table emptied. `--keys` gives every
job a distinct unique key (the ON CONFLICT path). Prints each round and the best of each;
the verdict compares the best bulk time with the target. Timings on a shared machine are
noisy: run it on a quiet one for the figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

from django.db import connection, transaction  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

import jobs  # noqa: E402

TARGET_SECONDS = 2.0


def _empty() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobcountdelta, jobs_jobcount, jobs_jobattempt")


def _payloads(n: int) -> list[dict]:
    return [{"proposal": i, "reason": "backfill"} for i in range(n)]


def bulk(n: int, keys: bool) -> tuple[float, int]:
    payloads = _payloads(n)
    unique_keys = [f"backfill:{i}" for i in range(n)] if keys else None
    started = time.perf_counter()
    with transaction.atomic():
        inserted = jobs.enqueue_many("bench.noop", payloads, unique_keys=unique_keys)
    return time.perf_counter() - started, inserted


def one_by_one(n: int, keys: bool) -> tuple[float, int]:
    payloads = _payloads(n)
    started = time.perf_counter()
    with transaction.atomic():
        for i, payload in enumerate(payloads):
            jobs.enqueue("bench.noop", payload, unique_key=f"backfill:{i}" if keys else None)
    return time.perf_counter() - started, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", action="store_true", help="a distinct unique key per job")
    parser.add_argument("--bulk-only", action="store_true", help="skip the enqueue calls")
    args = parser.parse_args()
    old_config = setup_databases(verbosity=0, interactive=False)
    best_bulk = best_single = float("inf")
    try:
        for round_ in range(1, args.rounds + 1):
            seconds, inserted = bulk(args.jobs, args.keys)
            assert inserted == args.jobs, inserted
            _empty()
            best_bulk = min(best_bulk, seconds)
            single = float("nan")
            if not args.bulk_only:
                single, _ = one_by_one(args.jobs, args.keys)
                _empty()
            best_single = min(best_single, single) if single == single else best_single
            print(
                f"round {round_}: enqueue_many {args.jobs:,} jobs {seconds:.2f} s "
                f"({args.jobs / seconds:,.0f} jobs/s); {args.jobs:,} enqueue calls "
                f"{single:.2f} s ({args.jobs / single:,.0f} jobs/s)",
                flush=True,
            )
    finally:
        teardown_databases(old_config, verbosity=0)
    verdict = "met" if best_bulk <= TARGET_SECONDS else "NOT MET"
    print(
        f"best: enqueue_many {best_bulk:.2f} s, enqueue calls {best_single:.2f} s "
        f"({best_single / best_bulk:.0f}x); keys: {'yes' if args.keys else 'no'}; "
        f"target <= {TARGET_SECONDS:.0f} s for {args.jobs:,}: {verdict}"
    )


if __name__ == "__main__":
    main()
