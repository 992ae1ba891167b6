"""Every database connection of one qcluster at full concurrency (issue 37, point 4).

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/connections.py [--workers 2] [--concurrency 50] [--blocking 1000] \
        [--async-jobs 2000] [--querying 0]

One `manage.py qcluster` child (Q_WORKERS=`--workers`, JOBS_CONCURRENCY=`--concurrency`,
the other settings their defaults), measured twice in the same run:

- idle: after start-up, nothing queued (the baseline);
- at full concurrency: `--blocking` jobs of `bench.block_1s` (`atomic=False`,
  `time.sleep(1)` in a thread slot) and `--async-jobs` jobs of `bench.async_sleep_1s`
  (`await asyncio.sleep(1)` on the event loop), and `--querying` jobs of
  `bench.query_block_1s` (`atomic=False`: one query, then `time.sleep(1)`: each slot
  needs a connection), inserted in one transaction; sampled every 0.1 s while they run.

The qcluster inherits this process's environment: `DB_POOL=0` (one connection per slot
thread) against `DB_POOL=1 DB_POOL_MAX_SIZE=N` (the process's pool) shows what the pool
bounds.

A connection is the qcluster's when its client port belongs to a process of the qcluster's
process tree (psutil), so every one is counted, the wake-up listener's too, whatever its
application_name. Prints the most seen at once, by application_name and state, beside the
issue's target (at most 3 x Q_WORKERS + 5) and the slots in use (jobs `processing`) at that
moment, with the load average. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psutil  # noqa: E402
import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django_q.models import OrmQ  # noqa: E402

from bench.slots import INSERT, start_qcluster  # noqa: E402
from bench.support import dsn_from_settings, ensure_database, stop_qcluster  # noqa: E402
from jobs.models import Job  # noqa: E402

BACKENDS = """
SELECT client_port, coalesce(nullif(application_name, ''), '(none)'), coalesce(state, '?')
FROM pg_stat_activity WHERE datname = current_database() AND client_port IS NOT NULL
"""


def tree_ports(root: int) -> set[int]:
    """The local TCP ports of every process in `root`'s tree (its connections' client side)."""
    ports: set[int] = set()
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return ports
    for process in processes:
        try:
            for conn in process.net_connections(kind="tcp"):
                if conn.laddr:
                    ports.add(conn.laddr.port)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ports


def sample(conn: psycopg.Connection, root: int) -> tuple[int, Counter, int]:
    """(connections of the tree, by (application_name, state), jobs processing) now."""
    ports = tree_ports(root)
    rows = conn.execute(BACKENDS).fetchall()
    mine = Counter((name, state) for port, name, state in rows if port in ports)
    processing = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE status = 'processing'"
    ).fetchone()[0]
    return sum(mine.values()), mine, processing


def describe(seen: Counter) -> str:
    return ", ".join(f"{name} [{state}] {n}" for (name, state), n in sorted(seen.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS")
    parser.add_argument("--concurrency", type=int, default=50, help="JOBS_CONCURRENCY")
    parser.add_argument("--blocking", type=int, default=1000, help="atomic=False jobs of 1 s")
    parser.add_argument("--async-jobs", type=int, default=2000, help="async def jobs of 1 s")
    parser.add_argument("--querying", type=int, default=0, help="jobs of one query + 1 s")
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    connection.close()  # the qcluster forks; nothing of ours should be open meanwhile

    target = 3 * args.workers + 5
    cluster = start_qcluster(args.workers, {"JOBS_CONCURRENCY": str(args.concurrency)})
    try:
        with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
            idle = max((sample(conn, cluster.pid) for _ in range(10)), key=lambda s: s[0])
            with conn.transaction():
                conn.execute(INSERT, ["bench.block_1s", args.blocking])
                conn.execute(INSERT, ["bench.async_sleep_1s", args.async_jobs])
                conn.execute(INSERT, ["bench.query_block_1s", args.querying])
            busiest = (0, Counter(), 0)
            most_slots = 0
            deadline = time.monotonic() + 600
            while conn.execute(
                "SELECT count(*) FROM jobs_job WHERE status <> 'completed'"
            ).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("not done after 600 s")
                now = sample(conn, cluster.pid)
                most_slots = max(most_slots, now[2])
                if now[0] > busiest[0]:
                    busiest = now
                time.sleep(0.1)
            twice = conn.execute("SELECT count(*) FROM jobs_job WHERE attempts > 1").fetchone()[0]
    finally:
        stop_qcluster(cluster)

    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"one qcluster, Q_WORKERS={args.workers} JOBS_CONCURRENCY={args.concurrency} (other "
        f"settings default); {args.blocking} atomic=False jobs of time.sleep(1) and "
        f"{args.async_jobs} async def jobs of asyncio.sleep(1), {args.querying} of a query and "
        f"time.sleep(1); DB_POOL={os.environ.get('DB_POOL', '(default)')} "
        f"DB_POOL_MAX_SIZE={os.environ.get('DB_POOL_MAX_SIZE', '(default)')}; "
        f"load average {load}"
    )
    print(f"  idle: {idle[0]} connections ({describe(idle[1])})")
    verdict = "met" if busiest[0] <= target else "NOT met"
    print(
        f"  at full concurrency: at most {busiest[0]} connections at once "
        f"(target <= 3 x {args.workers} + 5 = {target}: {verdict}) "
        f"while {busiest[2]} jobs ran ({describe(busiest[1])})"
    )
    print(f"  most jobs running at once: {most_slots}; {twice} ran more than once")


if __name__ == "__main__":
    main()
