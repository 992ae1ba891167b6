"""What the operator's views cost on a large database: worker_status (the baseline), the
Worker health page's data (worker_status + due count + two 24 h charts) and a /metrics scrape.

Usage (PostgreSQL; the database is created/migrated if needed, its jobs and mail emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python bench/health.py \
        [--jobs 200000] [--mails 20000] [--rounds 7]

Jobs are spread over 14 days (JOBS_RETENTION_DAYS), so about 1/14 fall in the chart's window;
mail over 7 days. All three run in this process, alternately; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.support import ensure_database  # noqa: E402
from ops.health import worker_health  # noqa: E402
from ops.metrics import render_metrics  # noqa: E402
from ops.status import worker_status  # noqa: E402


def fill(jobs: int, mails: int) -> None:
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, inbound_email_reply, inbound_email_inboundemail CASCADE")
        cursor.execute(
            """
            INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts,
                                  run_after, created_at, completed_at, failed_at, locked_by,
                                  last_error)
            SELECT 'bench.k' || (i %% 7), '{}'::jsonb,
                   CASE WHEN i %% 50 = 0 THEN 'failed' WHEN i %% 97 = 0 THEN 'queued'
                        ELSE 'completed' END,
                   0, 1, 5, t, t,
                   CASE WHEN i %% 50 <> 0 AND i %% 97 <> 0 THEN t END,
                   CASE WHEN i %% 50 = 0 THEN t END, '', ''
            FROM (SELECT i, %s - make_interval(secs => i * (14 * 86400.0 / %s)) AS t
                  FROM generate_series(1, %s) AS i) AS s
            """,
            [now, jobs, jobs],
        )
        cursor.execute(
            """
            INSERT INTO inbound_email_inboundemail
                (store_key, etag, size, sha256, dedup_key, message_id, from_address,
                 to_addresses, subject, headers_text, body_text, status, reason, detail,
                 attempts, last_error, quarantine_key, intake_deleted, created_at, updated_at)
            SELECT 'bench/' || i, '', 0, '', '', '', '', '', '', '', '',
                   CASE WHEN i %% 40 = 0 THEN 'quarantined' WHEN i %% 9 = 0 THEN 'rejected'
                        ELSE 'processed' END,
                   '', '', 1, '', '', true, t, t
            FROM (SELECT i, %s - make_interval(secs => i * (7 * 86400.0 / %s)) AS t
                  FROM generate_series(1, %s) AS i) AS s
            """,
            [now, mails, mails],
        )
        cursor.execute("ANALYZE jobs_job; ANALYZE inbound_email_inboundemail")


def timed(fn) -> tuple[float, int]:
    with CaptureQueriesContext(connection) as queries:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
    return elapsed * 1000, len(queries.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--mails", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    fill(args.jobs, args.mails)
    cases = {
        "worker_status() (baseline)": worker_status,
        "health page data": worker_health,
        "/metrics body": render_metrics,
    }
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results[name].append(timed(fn))
    base = statistics.median(ms for ms, _ in results["worker_status() (baseline)"])
    print(
        f"{args.jobs:,} jobs over 14 days, {args.mails:,} mails over 7 days, "
        f"{args.rounds} rounds (medians)"
    )
    print(f"{'':30}{'ms':>9}{'queries':>9}{'x baseline':>12}")
    for name, runs in results.items():
        ms = statistics.median(m for m, _ in runs)
        print(f"{name:30}{ms:9.1f}{runs[0][1]:9d}{ms / base:12.2f}")


if __name__ == "__main__":
    main()
