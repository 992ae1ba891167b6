"""A rate per kind across processes (issue 38, point 3): `@handler(kind, rate="20/s")`.

Usage (PostgreSQL; the database is created/migrated if needed and its jobs table emptied):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/rates.py [--jobs 1000] [--processes 3] [--mode run_jobs|qcluster]

`--processes` workers (`manage.py run_jobs` each, or qclusters of Q_WORKERS=2), started
first (each writes the handlers' rates at start-up), then `--jobs` jobs of `bench.rated_20`
(a no-op limited to 20/s) inserted in one transaction. Prints:

- the most claims in any one-second window (each row's `heartbeat_at`, the database's clock
  at its claim: the jobs take no time, so no lease renewal moves it) and the most handler
  starts (`started_at`, as the runner recorded them) in any one second: target at most 21;
- the time from the insert's commit to the last completion against the ideal (jobs / 20
  seconds: 50 s for 1,000): target at most 1.1 times it; and each job ran once;
- the claim's cost for an unlimited kind, same run: jobs 0024's claim (installed beside it
  under another name) and this release's `jobs_runner_step_v6`, claiming one
  `bench.noop` at a time (complete, claim; committed without the WAL flush, so the figure is
  the statement's work, not the disk's), with the jobs_kindrate table empty and then with
  the limited kind's row in it (idle), interleaved rounds: the rate must cost unlimited kinds
  nothing;
- the load average (the machine is shared) before and after.

Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
from django_q.models import OrmQ  # noqa: E402

from bench.support import dsn_from_settings, ensure_database, stop_qcluster  # noqa: E402
from jobs.models import Job, KindRate  # noqa: E402

KIND = "bench.rated_20"
PER_SECOND = 20
INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
SELECT %s, '{}'::jsonb, 'queued', 0, 0, 3, now(), now(), '', '' FROM generate_series(1, %s)
"""
STEP = """
SELECT id FROM {function}(%s, %s, %s, NULL, NULL, '{{}}', 1, 1000000, 60, false, '{{}}',
    NULL, '{{}}', '{{}}', '{{}}', NULL, NULL, true)
"""
BASELINE = "bench_runner_step_0024"  # the claim as jobs 0024 shipped it, before the rates


def install_baseline() -> None:
    """The claim of jobs 0024 (jobs_runner_step_v6 with 0022's jobs_kind_free_v1: caps and
    reserved slots, no rates) beside this release's, under other names: the same run
    measures both."""
    import importlib

    caps = importlib.import_module("jobs.migrations.0022_claim_honours_kind_caps")
    slots = importlib.import_module("jobs.migrations.0024_claim_honours_reserved_slots")
    with connection.cursor() as cursor:
        for sql in (caps.KIND_FREE, slots.RUNNER_STEP_V6):
            cursor.execute(
                sql.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
                .replace("jobs_kind_free_v1", "bench_kind_free_0022")
                .replace("jobs_runner_step_v6", BASELINE)
            )


def start_worker(mode: str, n: int) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(
        Q_WORKERS="2",
        JOBS_EXTRA_HANDLER_MODULES="bench.handlers",
        PYTHONPATH=str(ROOT),
        LOG_LEVEL="WARNING",
    )
    command = "qcluster" if mode == "qcluster" else "run_jobs"
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), command],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def peak_per_second(times: list) -> int:
    """The most of `times` in any closed one-second window."""
    times = sorted(t for t in times if t is not None)
    window = timedelta(seconds=1)
    peak, last = 0, 0
    for first, start in enumerate(times):
        while last < len(times) and times[last] <= start + window:
            last += 1
        peak = max(peak, last - first)
    return peak


def rated_round(jobs: int, processes: int, mode: str) -> dict:
    Job.objects.all().delete()
    OrmQ.objects.all().delete()
    KindRate.objects.all().delete()
    connection.close()  # the workers fork; nothing of ours should be open meanwhile
    workers = [start_worker(mode, n) for n in range(processes)]
    try:
        with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
            deadline = time.monotonic() + 60
            ready = "SELECT 1 FROM jobs_kindrate WHERE kind = %s"
            while not conn.execute(ready, [KIND]).fetchone():
                if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                    raise SystemExit("the workers did not start (is the database migrated?)")
                time.sleep(0.1)
            time.sleep(3)  # every worker past its start (the qclusters' schedules' first runs)
            with conn.transaction():
                conn.execute(INSERT, [KIND, jobs])
            committed = conn.execute("SELECT now()").fetchone()[0]
            deadline = time.monotonic() + 10 * jobs / PER_SECOND + 60
            while conn.execute(
                "SELECT count(*) FROM jobs_job WHERE status <> 'completed'"
            ).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("not done in time")
                time.sleep(0.5)
            rows = conn.execute(
                "SELECT heartbeat_at, started_at, completed_at, attempts FROM jobs_job"
            ).fetchall()
    finally:
        for worker in workers:
            if worker.poll() is None:
                stop_qcluster(worker)
    last = max(row[2] for row in rows)
    claims = sorted(row[0] for row in rows)
    gaps = sorted((b - a).total_seconds() * 1000 for a, b in zip(claims, claims[1:], strict=False))
    return {
        "gaps": {q: gaps[int(q / 100 * (len(gaps) - 1))] for q in (50, 90, 99, 100)},
        "claims": peak_per_second([row[0] for row in rows]),
        "starts": peak_per_second([row[1] for row in rows]),
        "seconds": (last - committed).total_seconds(),
        "twice": sum(1 for row in rows if row[3] > 1),
    }


def _function_ms(conn: psycopg.Connection, function: str) -> float:
    """The server's total time in `function` (track_functions), this session's included."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # idle in between: the pending counts are flushed
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT total_time FROM pg_stat_user_functions WHERE funcname = %s", [function]
    ).fetchone()
    return row[0] if row else 0.0


def claim_cost(
    steps: int, *, limited_row: bool, function: str = "jobs_runner_step_v6"
) -> tuple[float, float]:
    """Microseconds per step of claiming one unlimited job (and completing the previous):
    the client's round trip, and the server's time inside the function (track_functions:
    what the statement costs PostgreSQL, without the client's scheduling)."""
    step = STEP.format(function=function)
    Job.objects.all().delete()
    KindRate.objects.all().delete()
    if limited_row:
        KindRate.objects.create(kind=KIND, rate="20/s", interval_seconds=0.05)
    with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
        conn.execute(INSERT, ["bench.noop", steps])
        conn.execute("ANALYZE jobs_job")
        done: list[int] = []
        for _ in range(20):  # the plans made, the caches warm
            done = [r[0] for r in conn.execute(step, ["w", done, [0.0] * len(done)]) if r[0]]
        conn.execute("SET track_functions = 'pl'")
        server = _function_ms(conn, function)
        started = time.perf_counter()
        for _ in range(steps - 40):
            done = [r[0] for r in conn.execute(step, ["w", done, [0.0] * len(done)]) if r[0]]
        client = (time.perf_counter() - started) / (steps - 40) * 1e6
        return client, (_function_ms(conn, function) - server) / (steps - 40) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--mode", choices=["run_jobs", "qcluster"], default="run_jobs")
    parser.add_argument("--claim-steps", type=int, default=400)
    parser.add_argument("--claim-rounds", type=int, default=8)
    parser.add_argument("--only", choices=["claims", "rate"], default=None)
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    print(f"load average before: {os.getloadavg()}")
    costs: dict[str, list[tuple[float, float]]] = {}
    install_baseline()
    configs = {
        "jobs 0024's claim (before rates), no limited kind": (BASELINE, False),
        "this release's claim, no limited kind": ("jobs_runner_step_v6", False),
        "this release's claim, the limited kind's row idle": ("jobs_runner_step_v6", True),
    }
    # Interleaved rounds: the machine's load drifts.
    for _ in range(0 if args.only == "rate" else args.claim_rounds):
        for key, (function, limited_row) in configs.items():
            costs.setdefault(key, []).append(
                claim_cost(args.claim_steps, limited_row=limited_row, function=function)
            )
    for key, values in costs.items():
        client = [v[0] for v in values]
        server = [v[1] for v in values]
        print(
            f"unlimited claim step, {key}: round trip median {statistics.median(client):.0f} "
            f"µs (best {min(client):.0f}); in the server median {statistics.median(server):.0f} "
            f"µs (best {min(server):.0f}; rounds: {', '.join(f'{v:.0f}' for v in server)})"
        )
    if args.only == "claims":
        print(f"load average after: {os.getloadavg()}")
        return
    ideal = args.jobs / PER_SECOND
    result = rated_round(args.jobs, args.processes, args.mode)
    print(
        f"{args.jobs} jobs of a kind at {PER_SECOND}/s on {args.processes} {args.mode} "
        f"processes: at most {result['claims']} claims and {result['starts']} handler starts "
        f"in any one second (target <= {PER_SECOND + 1}); {result['seconds']:.1f} s against "
        f"the ideal {ideal:.0f} s = {result['seconds'] / ideal:.3f}x (target <= 1.1x); "
        f"{result['twice']} ran more than once"
    )
    gaps = ", ".join(f"p{q} {ms:.0f}" for q, ms in result["gaps"].items())
    print(f"ms between one claim and the next (ideal {1000 / PER_SECOND:.0f}): {gaps}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
