"""Enqueue→start latency with a running qcluster, for Django enqueues and plain INSERTs.

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/latency.py [--rates 30,150] [--seconds 10] [--workers 2]

Starts `manage.py qcluster` (with its wake-up listener) as a child process, then for each
producer and rate inserts no-op jobs at that steady rate: `enqueue()` through Django, or a
plain `INSERT` on a psycopg connection of its own (what the web app and the Slack bot do).
A job's latency is `started_at - created_at`: from the producer's commit (the row's
creation, microseconds before it) to the runner's claim. A sampler counts the django-q2 ORM
broker's rows every 10 ms: the peak of wake tasks and of all tasks. Targets (issue 29,
point 5): p95 <= 50 ms for both producers at 100 jobs/s (`--rates 100`); wake tasks never
above workers + 2. A drain out of jobs lingers (JOBS_LINGER_SECONDS) and asks every
JOBS_LINGER_POLL_SECONDS whether one is due, so at a steady rate jobs start within that
poll rather than after django-q2's broker poll (Q_POLL, 0.2 s).

`--idle-burst N` adds, after the steady rates, N jobs committed one after another as fast as
the producer can, each producer once, after the qcluster has had nothing to do for
`--idle-seconds` (60): the drains' lingers have ended and the workers wait on django-q2's
broker, so only the wake-up listener can start them at once (issue 37, point 1: the wake-up
p95 under 50 ms, "a burst after an idle minute included").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django_q.models import OrmQ  # noqa: E402

from bench.support import dsn_from_settings, ensure_database, stop_qcluster  # noqa: E402, F401
from jobs import enqueue  # noqa: E402
from jobs.models import Job  # noqa: E402
from jobs.wake_tasks import wake_tasks_in_broker  # noqa: E402

KIND = "bench.noop"  # registered by bench/handlers.py in the qcluster's workers
PLAIN_INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
VALUES (%s, %s, 'queued', 0, 0, 3, now(), clock_timestamp(), '', '')
"""


class Sampler(threading.Thread):
    """Peak number of wake tasks, and of all tasks, in the ORM broker."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.running = True
        self.peak_wake = 0
        self.peak_all = 0
        self.funcs: dict[int, str] = {}  # decoded task functions by broker row id

    def run(self) -> None:
        try:
            while self.running:
                total = OrmQ.objects.count()
                self.peak_all = max(self.peak_all, total)
                if total > self.peak_wake:  # decoding payloads is only needed for a new peak
                    self.peak_wake = max(self.peak_wake, wake_tasks_in_broker(funcs=self.funcs)[0])
                time.sleep(0.01)
        finally:
            connections.close_all()


def produce(producer: str, rate: float, count: int, label: str) -> int:
    """Insert `count` jobs at a steady `rate` (inf: back to back); return how many."""
    payload = json.dumps({"run": label})
    conn = psycopg.connect(dsn_from_settings(), autocommit=True) if producer == "insert" else None
    start = time.perf_counter()
    try:
        for i in range(count):
            delay = start + i / rate - time.perf_counter()  # i / inf: 0
            if delay > 0:
                time.sleep(delay)
            if conn is not None:
                conn.execute(PLAIN_INSERT, [KIND, payload])
            else:
                enqueue(KIND, {"run": label})
    finally:
        if conn is not None:
            conn.close()
    return count


def measure(producer: str, rate: float, count: int) -> dict:
    label = f"{producer}-{rate:g}-{time.time():.0f}"
    sampler = Sampler()
    sampler.start()
    count = produce(producer, rate, count, label)
    rows = Job.objects.filter(payload__run=label)
    deadline = time.monotonic() + 120
    while rows.filter(status=Job.Status.COMPLETED).count() < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{producer} at {rate}/s: jobs did not complete within 120 s")
        time.sleep(0.2)
    sampler.running = False
    sampler.join()
    latencies = sorted(
        (started - created).total_seconds()
        for started, created in rows.values_list("started_at", "created_at")
    )
    cuts = statistics.quantiles(latencies, n=100)
    return {
        "count": count,
        "p50": statistics.median(latencies),
        "p95": cuts[94],
        "max": latencies[-1],
        "peak_wake": sampler.peak_wake,
        "peak_all": sampler.peak_all,
    }


def measure_burst(producer: str, count: int, idle: float) -> dict:
    """Wait `idle` seconds with nothing queued, then commit `count` jobs back to back."""
    time.sleep(idle)
    return measure(producer, rate=float("inf"), count=count)


def start_qcluster(workers: int) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        Q_WORKERS=str(workers),
        JOBS_EXTRA_HANDLER_MODULES="bench.handlers",
        PYTHONPATH=str(ROOT),
        LOG_LEVEL="WARNING",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="30,150", help="jobs/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="per producer and rate")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS of the qcluster")
    parser.add_argument(
        "--idle-burst", type=int, default=0, help="then N jobs at once after an idle spell"
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="the idle spell")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]

    ensure_database()
    call_command("migrate", verbosity=0)
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    connection.close()  # the qcluster forks; nothing of ours should be open meanwhile

    cluster = start_qcluster(args.workers)
    results = []
    try:
        for rate in rates:
            order = ("django", "insert") if len(results) % 4 == 0 else ("insert", "django")
            for producer in order:
                results.append((producer, rate, measure(producer, rate, int(rate * args.seconds))))
        if args.idle_burst:
            for producer in ("insert", "django"):
                burst = measure_burst(producer, args.idle_burst, args.idle_seconds)
                results.append((producer, f"burst after {args.idle_seconds:g} s idle", burst))
    finally:
        stop_qcluster(cluster)
        Job.objects.filter(kind=KIND).delete()

    print(
        f"enqueue→start latency, qcluster with {args.workers} workers, DEBUG={settings.DEBUG}, "
        f"{args.seconds:g} s per row (target: p95 <= 50 ms at 100/s; "
        f"wake tasks <= {args.workers + 2})"
    )
    print(
        f"  {'producer':<18}{'jobs/s':>24}{'jobs':>6}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}"
        f"{'peak wake':>11}{'peak tasks':>12}"
    )
    names = {"django": "Django enqueue()", "insert": "plain INSERT"}
    for producer, rate, r in results:
        print(
            f"  {names[producer]:<18}{rate:>24}{r['count']:6d}{r['p50'] * 1000:9.0f}"
            f"{r['p95'] * 1000:9.0f}{r['max'] * 1000:9.0f}{r['peak_wake']:11d}{r['peak_all']:12d}"
        )


if __name__ == "__main__":
    main()
