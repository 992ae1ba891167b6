"""No-op job throughput of one worker process: our runner vs bare psycopg loops and pgqueuer.

Usage (PostgreSQL; the database is created/migrated if needed and its job tables emptied):

    .venv/bin/pip install 'pgqueuer==1.6.*'   # for the comparison only, not a dependency
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python bench/jobs.py \
        [--jobs 20000] [--rounds 3]

Issue 22, point 5: N no-op jobs drained by one worker process, each runner in turn, rounds
interleaved (the order rotates every round: load drifts), all in this one process:

- **jobs runner**: `run_pending()` over `jobs_job`, with every trigger the migrations put on
  it (wake-up, counts, attempt history, rates and histograms), as production runs it.
- **bare loop, batch claim**: the floor of what PostgreSQL can do: a psycopg loop claiming
  20 rows per statement (`UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)`), then
  completing the 20 in one statement; a table of the same shape (`LIKE jobs_job INCLUDING
  ALL`) with only the wake-up triggers. It holds up to 19 jobs it has not started however
  long the running one takes (the runner gives them back after
  JOBS_HOLD_UNSTARTED_SECONDS, issue 22's point 4).
- **bare loop, one-row claim** (`--one-row`): the same loop claiming one row and completing
  it in a transaction of its own (two commits a job).
- **pgqueuer 1.6**: its `QueueManager` in drain mode on a psycopg async connection, default
  settings (dequeue batches of 10; completions buffered and written per batch); skipped,
  with a note, when pgqueuer is not installed.

Printed per runner: the median jobs/s over the rounds (each round listed), the CPU time of
this process and of its PostgreSQL backend per job (read from /proc: the server is local),
and the runner's ratio to pgqueuer and to the batch loop. Before each round the tables are
refilled and vacuumed (the server's autovacuum may be off; dead rows of an earlier round
would slow the next one), and the runner's attempt history is emptied.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.support import COUNTER_TABLES, dsn_from_settings, ensure_database  # noqa: E402
from jobs import handler, run_pending  # noqa: E402
from ops.rollups import counters_roll_up  # noqa: E402

BATCH = 20  # rows per claim statement of the batch loop (the baseline)


@handler("bench.noop", idempotent=True)
def noop(payload: dict) -> None:
    pass


@handler("bench.noop_default")
def noop_default(payload: dict) -> None:
    """The same no-op, not declared idempotent: each completion flushed before the next job."""


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
WHERE id = ANY(%s) AND locked_by = %s AND status = 'processing'
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    rate: float  # jobs/s
    worker_us: float  # CPU of this process per job
    server_us: float  # CPU of the PostgreSQL backend per job


@dataclass
class Runner:
    name: str
    run: Callable[[int], Round]
    rounds: list[Round] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.rounds)


def backend_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) a local PostgreSQL backend has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Meter:
    """Wall time, this process' CPU and a backend's CPU over a block."""

    def __init__(self, backend_pid: int) -> None:
        self.pid = backend_pid

    def __enter__(self) -> Meter:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.server = backend_cpu(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.server = backend_cpu(self.pid) - self.server

    def round(self, count: int) -> Round:
        return Round(count / self.wall, self.cpu / count * 1e6, self.server / count * 1e6)


def fill(
    table: str, count: int, *, also_vacuum: tuple[str, ...] = (), kind: str = "bench.noop"
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        cursor.execute(
            f"""
            INSERT INTO {table} (kind, payload, status, priority, attempts, max_attempts,
                                 run_after, created_at, locked_by, last_error)
            SELECT %s, '{{}}'::jsonb, 'queued', 0, 0, 5, now(), now(), '', ''
            FROM generate_series(1, %s)
            """,
            [kind, count],
        )
        for name in (table, *also_vacuum):
            cursor.execute(f"VACUUM ANALYZE {name}")


def bench_runner(count: int, *, kind: str = "bench.noop", triggers: bool = True) -> Round:
    """`run_pending()` over `count` jobs of `kind`; with `triggers=False` the table's user
    triggers are disabled for the round (what the counts, history, rates and wake-up cost)."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_jobattempt")
    # Not ANALYZE the emptied history: statistics saying "no rows" put the attempt trigger's
    # cached plan on a sequential scan for the whole round (quadratic, a bench artefact).
    # The counter deltas of the round before are folded as the minute schedule would (issue
    # 32), so each round starts from the steady state.
    counters_roll_up()
    fill("jobs_job", count, also_vacuum=COUNTER_TABLES, kind=kind)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
        if not triggers:
            cursor.execute("ALTER TABLE jobs_job DISABLE TRIGGER USER")
    try:
        with Meter(pid) as meter:
            summary = run_pending()
    finally:
        if not triggers:
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE jobs_job ENABLE TRIGGER USER")
    assert summary.completed == count, summary
    return meter.round(count)


def bench_bare(count: int, dsn: str, batch: int, *, async_commit: bool = False) -> Round:
    fill("bench_bare_job", count)
    done = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cursor:
        if async_commit:  # the loop's commits do not wait for the WAL flush
            cursor.execute("SET synchronous_commit = off")
            conn.commit()
        with Meter(conn.info.backend_pid) as meter:
            while True:
                cursor.execute(BARE_CLAIM, (batch, "bare"))
                claimed = [row[0] for row in cursor.fetchall()]
                conn.commit()
                if not claimed:
                    break
                # no-op handlers: nothing to run
                cursor.execute(BARE_COMPLETE, (claimed, "bare"))
                conn.commit()
                done += cursor.rowcount
    assert done == count, done
    return meter.round(count)


def bench_pgqueuer(count: int, dsn: str) -> Round:
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def drain() -> Round:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            queries = Queries(PsycopgDriver(conn))
            if not await queries.schema_is_installed():
                await queries.install()
            await queries.clear_queue()
            await queries.clear_queue_log()
            await queries.enqueue(["bench.noop"] * count, [None] * count, [0] * count)
            for table in ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics"):
                await conn.execute(f"VACUUM ANALYZE {table}")
            manager = QueueManager(queries)

            @manager.entrypoint("bench.noop")
            async def pgq_noop(job: object) -> None:
                pass

            with Meter(conn.info.backend_pid) as meter:
                await manager.run(mode=QueueExecutionMode.drain)
            left = await conn.execute("SELECT count(*) FROM pgqueuer")
            (queued,) = await left.fetchone()
            assert queued == 0, f"{queued} pgqueuer jobs left"
            return meter.round(count)
        finally:
            await conn.close()

    return asyncio.run(drain())


def pgqueuer_version() -> str | None:
    try:
        import pgqueuer
    except ImportError:
        return None
    return pgqueuer.__version__


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def prepare_bare_table() -> None:
    """The bare loops' table: jobs_job's shape, with only the wake-up triggers."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare_job")
        cursor.execute("CREATE TABLE bench_bare_job (LIKE jobs_job INCLUDING ALL)")
        # The same wake-up triggers as jobs_job (migration 0002): their cost is the database's,
        # paid by any loop over the table. Not the counts, history or rates (issue 20).
        for event, referencing in BARE_TRIGGERS:
            cursor.execute(
                f"CREATE TRIGGER bench_bare_notify_due_{event.lower()} AFTER {event} "
                f"ON bench_bare_job REFERENCING {referencing} "
                "FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due()"
            )


def drop_bare_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare_job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--one-row", action="store_true", help="also the bare loop claiming one row (slow)"
    )
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)  # every app: the triggers on jobs_job come from several
    prepare_bare_table()
    dsn = dsn_from_settings()
    version = pgqueuer_version()
    runners = [
        Runner("runner, idempotent kind", bench_runner),
        Runner(
            f"bare loop, {BATCH} rows, async",
            lambda n: bench_bare(n, dsn, BATCH, async_commit=True),
        ),
        Runner(f"bare loop, {BATCH} rows", lambda n: bench_bare(n, dsn, BATCH)),
        Runner("runner, default kind", lambda n: bench_runner(n, kind="bench.noop_default")),
        Runner("runner, idem., no triggers", lambda n: bench_runner(n, triggers=False)),
    ]
    if args.one_row:
        runners.append(Runner("bare loop, claim 1 row", lambda n: bench_bare(n, dsn, 1)))
    if version is not None:  # last: the ratio below reads it there
        runners.append(Runner(f"pgqueuer {version}", lambda n: bench_pgqueuer(n, dsn)))

    print(f"before: {load_average()}")
    for runner in runners:  # warm-up: imports, connections, plans, pgqueuer's schema
        runner.run(min(args.jobs, 500))
    for round_no in range(args.rounds):  # rotate who goes first: load drifts
        shift = round_no % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            runner.rounds.append(runner.run(args.jobs))
    print(f"after:  {load_average()}")

    print(
        f"no-op jobs, 1 worker process, PostgreSQL {connection.pg_version // 10000}, "
        f"{args.jobs} jobs x {args.rounds} rounds (medians), DEBUG={settings.DEBUG}"
    )
    print(f"{'':30}{'jobs/s':>8}{'worker CPU':>12}{'server CPU':>12}{'total':>8}   rounds (jobs/s)")
    print(f"{'':30}{'':>8}{'µs/job':>12}{'µs/job':>12}{'µs/job':>8}")
    for runner in runners:
        worker_us, server_us = runner.median("worker_us"), runner.median("server_us")
        print(
            f"  {runner.name:28}{runner.median('rate'):8.0f}{worker_us:12.0f}"
            f"{server_us:12.0f}{worker_us + server_us:8.0f}   "
            + ", ".join(f"{r.rate:.0f}" for r in runner.rounds)
        )

    def cpu(runner: Runner) -> float:
        return runner.median("worker_us") + runner.median("server_us")

    ours, loop_async, batch = runners[0], runners[1], runners[2]
    default, bare_triggers = runners[3], runners[4]
    print(
        f"  ratio runner / bare batch loop: {ours.median('rate') / batch.median('rate'):.2f}"
        f"  (async loop: {ours.median('rate') / loop_async.median('rate'):.2f})"
    )
    print(f"  CPU runner / async batch loop:  {cpu(ours) / cpu(loop_async):.2f}  (goal <= 2)")
    print(
        f"  the table's triggers cost the runner {cpu(ours) - cpu(bare_triggers):.0f} µs/job "
        f"(server {ours.median('server_us') - bare_triggers.median('server_us'):.0f})"
    )
    print(
        f"  default kind (not idempotent, each completion flushed): "
        f"{default.median('rate'):.0f} jobs/s, {cpu(default):.0f} µs/job"
    )
    if version is None:
        print("  pgqueuer not installed: .venv/bin/pip install 'pgqueuer==1.6.*' to compare")
    else:
        pgq = runners[-1].median("rate")
        print(f"  ratio runner / pgqueuer:        {ours.median('rate') / pgq:.2f}  (goal >= 1.5)")
        print(f"  ratio default kind / pgqueuer:  {default.median('rate') / pgq:.2f}")
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_bare_job")
        cursor.execute("TRUNCATE jobs_job")
        cursor.execute("TRUNCATE jobs_jobattempt")


if __name__ == "__main__":
    main()
