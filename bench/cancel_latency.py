"""How soon a cancel reaches a running job (issue 37, point 8: "within a second").

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/cancel_latency.py [--jobs 20] [--workers 2] [--concurrency 10]

One `manage.py qcluster` child (Q_WORKERS=`--workers`, JOBS_CONCURRENCY=`--concurrency`)
runs `--jobs` thread handlers waiting on `job.stop_requested` and as many `async def`
handlers awaiting a long sleep, all at once. They are then cancelled one at a time, as the
admin's Cancel does (`cancel_requested_at = now()`), 0.3 s apart; for each, the time from
that commit to the job's `cancelled` commit (both on the database's clock): the keeper's
poll (CANCEL_POLL_SECONDS), the handler's stop and the completer's write. Prints p50, p95
and the maximum per kind of handler, and the load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
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

from bench.slots import INSERT, start_qcluster  # noqa: E402
from bench.support import dsn_from_settings, ensure_database, stop_qcluster  # noqa: E402
from jobs.models import Job  # noqa: E402

KINDS = {"thread": "bench.wait_for_stop", "async": "bench.async_wait_for_stop"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs of each kind of handler")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS")
    parser.add_argument("--concurrency", type=int, default=10, help="JOBS_CONCURRENCY")
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    connection.close()
    load_before = os.getloadavg()
    cluster = start_qcluster(args.workers, {"JOBS_CONCURRENCY": str(args.concurrency)})
    seconds: dict[str, list[float]] = {name: [] for name in KINDS}
    try:
        with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
            with conn.transaction():
                for kind in KINDS.values():
                    conn.execute(INSERT, [kind, args.jobs])
            deadline = time.monotonic() + 120
            while conn.execute(
                "SELECT count(*) FROM jobs_job WHERE status <> 'processing' OR started_at IS NULL"
            ).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("the jobs did not all start within 120 s")
                time.sleep(0.2)
            for name, kind in KINDS.items():
                ids = [row[0] for row in conn.execute(
                    "SELECT id FROM jobs_job WHERE kind = %s ORDER BY id", [kind]
                )]  # fmt: skip
                for pk in ids:
                    [asked] = conn.execute(
                        "UPDATE jobs_job SET cancel_requested_at = now() WHERE id = %s "
                        "RETURNING cancel_requested_at",
                        [pk],
                    ).fetchone()
                    time.sleep(0.3)
                    seconds[name].append(_cancelled_after(conn, pk, asked))
    finally:
        stop_qcluster(cluster)
    load_after = os.getloadavg()
    for name, values in seconds.items():
        values.sort()
        p95 = values[max(0, round(0.95 * len(values)) - 1)]
        print(
            f"{name} handlers ({len(values)}): cancel commit -> job cancelled "
            f"p50 {statistics.median(values):.3f} s, p95 {p95:.3f} s, max {values[-1]:.3f} s"
        )
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")


def _cancelled_after(conn: psycopg.Connection, pk: int, asked) -> float:  # noqa: ANN001
    deadline = time.monotonic() + 30
    while True:
        row = conn.execute(
            "SELECT status, cancelled_at FROM jobs_job WHERE id = %s", [pk]
        ).fetchone()
        if row[0] == "cancelled":
            return (row[1] - asked).total_seconds()
        if time.monotonic() > deadline:
            raise SystemExit(f"job #{pk} not cancelled 30 s after the request ({row[0]})")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
