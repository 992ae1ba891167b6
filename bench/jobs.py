"""No-op job throughput of one worker process: our runner vs a bare psycopg loop.

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python bench/jobs.py \
        [--jobs 5000] [--rounds 3]

Both loops run in this one process, alternately, over tables of the same shape (the bare
loop's table is `CREATE TABLE … (LIKE jobs_job INCLUDING ALL)`), and do the same work per
job: a batch claim (SELECT … FOR UPDATE SKIP LOCKED + UPDATE, one transaction), then per
job its own transaction with a guarded completion UPDATE and a COMMIT; both tables carry
the wake-up triggers of migration 0002. The difference is what the framework costs: the
ORM, the registry, the summary, the heartbeat thread.
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
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.support import dsn_from_settings, ensure_database  # noqa: E402
from jobs import handler, run_pending  # noqa: E402


@handler("bench.noop")
def noop(payload: dict) -> None:
    pass


BARE_TRIGGERS = (
    ("INSERT", "NEW TABLE AS new_rows"),
    ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
)
BARE_CLAIM = """
WITH due AS (
    SELECT id FROM bench_bare_job
    WHERE status = 'queued' AND run_after <= now() AND attempts < max_attempts
    ORDER BY priority DESC, run_after, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_bare_job AS j
SET status = 'processing', attempts = j.attempts + 1, started_at = now(),
    heartbeat_at = now(), lease_expires_at = now() + interval '120 seconds', locked_by = %s
FROM due WHERE j.id = due.id
RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts
"""
BARE_COMPLETE = """
UPDATE bench_bare_job
SET status = 'completed', completed_at = now(), locked_by = '', lease_expires_at = NULL
WHERE id = %s AND locked_by = %s AND status = 'processing'
"""


def fill(table: str, count: int) -> None:
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        cursor.execute(
            f"""
            INSERT INTO {table} (kind, payload, status, priority, attempts, max_attempts,
                                 run_after, created_at, locked_by, last_error)
            SELECT 'bench.noop', '{{}}'::jsonb, 'queued', 0, 0, 5, %s, %s, '', ''
            FROM generate_series(1, %s)
            """,
            [now, now, count],
        )
        cursor.execute(f"VACUUM ANALYZE {table}")


def bench_framework(count: int) -> tuple[float, float]:
    """(jobs/s, CPU µs of this process per job)."""
    fill("jobs_job", count)
    started, cpu = time.perf_counter(), time.process_time()
    summary = run_pending()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert summary.completed == count, summary
    return count / elapsed, cpu / count * 1e6


def bench_bare(count: int, dsn: str, batch: int) -> tuple[float, float]:
    fill("bench_bare_job", count)
    done = 0
    with psycopg.connect(dsn) as conn:
        started, cpu = time.perf_counter(), time.process_time()
        while True:
            with conn.cursor() as cursor:
                cursor.execute(BARE_CLAIM, (batch, "bare"))
                claimed = cursor.fetchall()
                conn.commit()
                if not claimed:
                    break
                for job_id, _kind, _payload, _attempts, _max in claimed:
                    cursor.execute(BARE_COMPLETE, (job_id, "bare"))
                    conn.commit()
                    done += 1
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert done == count, done
    return count / elapsed, cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", "jobs", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare_job")
        cursor.execute("CREATE TABLE bench_bare_job (LIKE jobs_job INCLUDING ALL)")
        # The same wake-up triggers as jobs_job (migration 0002): their cost is the database's,
        # paid by any loop over the table, not the framework's.
        for event, referencing in BARE_TRIGGERS:
            cursor.execute(
                f"CREATE TRIGGER bench_bare_notify_due_{event.lower()} AFTER {event} "
                f"ON bench_bare_job REFERENCING {referencing} "
                "FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due()"
            )
    dsn = dsn_from_settings()
    batch = settings.JOBS_CLAIM_BATCH_SIZE

    bench_framework(min(args.jobs, 500))  # warm-up: imports, connections, plans
    bench_bare(min(args.jobs, 500), dsn, batch)
    ours, bare = [], []
    for round_no in range(args.rounds):  # alternate which goes first: load drifts
        if round_no % 2:
            bare.append(bench_bare(args.jobs, dsn, batch))
            ours.append(bench_framework(args.jobs))
        else:
            ours.append(bench_framework(args.jobs))
            bare.append(bench_bare(args.jobs, dsn, batch))
    ours_rate = statistics.median(rate for rate, _ in ours)
    bare_rate = statistics.median(rate for rate, _ in bare)
    ours_cpu = statistics.median(cpu for _, cpu in ours)
    bare_cpu = statistics.median(cpu for _, cpu in bare)
    print(
        f"no-op jobs, 1 worker process, PostgreSQL, claim batch {batch}, "
        f"{args.jobs} jobs x {args.rounds} rounds (medians), DEBUG={settings.DEBUG}"
    )
    print(f"{'':28}{'jobs/s':>9}{'CPU µs/job':>12}   rounds (jobs/s)")
    for name, rate, cpu, rounds in (
        ("jobs runner (run_pending)", ours_rate, ours_cpu, ours),
        ("bare psycopg loop", bare_rate, bare_cpu, bare),
    ):
        print(f"  {name:26}{rate:9.0f}{cpu:12.0f}   " + ", ".join(f"{r:.0f}" for r, _ in rounds))
    print(f"  ratio runner/bare (jobs/s): {ours_rate / bare_rate:.2f}")
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare_job")
        cursor.execute("TRUNCATE jobs_job")


if __name__ == "__main__":
    main()
