#!/usr/bin/env python
"""What issue 38's columns and indexes cost the claim and the completion (point 5: keep the
unique keys', tags' and meta's indexes off the claim's path).

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker \
        .venv/bin/python bench/keyed_claim_cost.py

Claims and completes `--jobs` jobs with the runner's statement (`job_runner_step`, batches
of 20, completions sent with the next claim) in four cases and prints, per job, the WAL the
claim and the completion wrote (`pg_current_wal_lsn`, the cluster's: run it on a quiet
server) and the wall time: jobs without key, tags or meta; the same with migration 0019's
indexes and trigger dropped (the release before, for comparison); jobs with a unique key;
jobs with a unique key, `unique_for`, two tags and a meta object. WAL is the steady
measure; the times are noisy on a shared machine.
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

from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

import jobs  # noqa: E402
from jobs.runner_step import job_runner_step, new_worker_id  # noqa: E402

DROP_0019 = """
DROP INDEX jobs_job_unique_key; DROP INDEX jobs_job_tags_idx; DROP INDEX jobs_job_meta_idx;
DROP INDEX jobs_job_cancelled_at_idx; ALTER TABLE jobs_job DISABLE TRIGGER jobs_job_unique_key_kept;
"""


def _lsn() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _drain() -> int:
    worker = new_worker_id()
    done: list[tuple[int, float]] = []
    total = 0
    while True:
        step = job_runner_step(worker=worker, done=done, claim=20, durable=False)
        done = [(job.id, 0.0) for job in step.claimed]
        total += len(step.claimed)
        if not step.claimed:
            return total


def case(name: str, n: int, **options) -> None:
    payloads = [{"n": i} for i in range(n)]
    keys = [f"{name}:{i}" for i in range(n)] if options.pop("keys", False) else None
    jobs.enqueue_many("bench.noop", payloads, unique_keys=keys, **options)
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # full-page images alike in every case
    before, started = _lsn(), time.perf_counter()
    assert _drain() == n
    seconds, wal = time.perf_counter() - started, _lsn() - before
    print(f"{name:<34} {wal / n:8.0f} B WAL/job {seconds / n * 1e6:8.0f} µs/job", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobuniquekey, jobs_jobattempt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        for _ in range(2):
            case("plain", args.jobs)
            case("unique key", args.jobs, keys=True)
            case(
                "key, unique_for, 2 tags, meta",
                args.jobs,
                keys=True,
                unique_for=3600,
                tags=["backfill", "slack"],
                meta={"proposal": 812},
            )
        with connection.cursor() as cursor:
            cursor.execute(DROP_0019)
        case("plain, 0019's indexes dropped", args.jobs)
        case("plain, 0019's indexes dropped", args.jobs)
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
