"""Issue 37, point 4: many jobs at once, side by side with pgqueuer in the same run.

Usage (PostgreSQL; the database is created/migrated if needed and its job tables emptied;
pgqueuer is for the comparison only, not a dependency):

    .venv/bin/pip install 'pgqueuer==1.6.*'
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python \
        bench/against_pgqueuer.py [--part qcluster|noop|all] [--blocking 1000] \
        [--async-jobs 5000] [--noop-jobs 5000] [--rounds 3]

Part `qcluster` (each round a fresh `manage.py qcluster` child, Q_WORKERS=2):

- `--blocking` jobs of `bench.block_1s` (`atomic=False`, `time.sleep(1)`), JOBS_CONCURRENCY=50:
  seconds from the insert's commit to the last completion (database clock); target at most
  1.5 x the ideal (jobs / 100 slots); each job once (`attempts = 1`);
- `--async-jobs` jobs of `await asyncio.sleep(1)`, the same qcluster (JOBS_CONCURRENCY=50,
  the default JOBS_ASYNC_CONCURRENCY): target at most 15 s; pgqueuer's QueueManager with its
  defaults (one process, drain mode) on the same number of the same jobs, for comparison;
- memory: the sum of RSS and of PSS over the qcluster's process tree, at full concurrency
  after 3 s of warm-up (the largest sample), against an idle qcluster of the previous
  defaults (Q_WORKERS=2, JOBS_CONCURRENCY=1) measured the same way; target at most 1.3 x;
- connections: the most backends of the database seen at once (the listener's included);
  target at most 3 x Q_WORKERS + 5 = 11.

Part `noop` (all in this process, rounds interleaved, the order rotating: load drifts):
`--noop-jobs` no-op jobs drained by `run_pending()` (what `manage.py run_jobs` runs) of a
kind NOT declared idempotent with JOBS_CONCURRENCY 1, 10 (the issue's default) and 20, of
an idempotent kind with 1 and 10, pgqueuer with its defaults, and bench/jobs.py's bare
loops on a table of the same shape (claim 1 row with synchronous commit; claim 20 rows with
asynchronous commit). CPU per job is this process's (every thread) plus every backend of
the database (a slot's connection included), from /proc.

Prints the figures, the targets and the load average; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from bench import jobs as jobs_bench  # noqa: E402  (its no-op kinds and bare loops)
from bench.measure import BackendCpu, load_average, tree_memory  # noqa: E402
from bench.slots import INSERT, start_qcluster  # noqa: E402
from bench.support import (  # noqa: E402
    COUNTER_TABLES,
    dsn_from_settings,
    ensure_database,
    stop_qcluster,
)
from jobs import run_pending  # noqa: E402
from ops.rollups import counters_roll_up  # noqa: E402

WORKERS = 2


# --- part qcluster --------------------------------------------------------------------------


@dataclass
class ClusterRound:
    seconds: float
    twice: int
    rss_mb: float = 0.0
    pss_mb: float = 0.0
    processes: int = 0
    connections: int = 0
    load: str = ""


def clear_jobs() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobattempt")
        cursor.execute("DELETE FROM django_q_ormq")
    connection.close()  # the qcluster forks; nothing of ours should be open meanwhile


def cluster_round(kind: str, jobs: int, extra: dict[str, str], full: int) -> ClusterRound:
    """`jobs` of `kind` through a fresh qcluster; memory and connections sampled while at
    least `full` jobs are processing, 3 s after the commit (warm-up)."""
    clear_jobs()
    cluster = start_qcluster(WORKERS, extra)
    try:
        with psycopg.connect(dsn_from_settings(), autocommit=True) as conn:
            own = conn.info.backend_pid
            with conn.transaction():
                conn.execute(INSERT, [kind, jobs])
            committed = conn.execute("SELECT now()").fetchone()[0]
            started = time.monotonic()
            result = ClusterRound(0.0, 0)
            while True:
                left, processing, backends = conn.execute(
                    "SELECT (SELECT count(*) FROM jobs_job WHERE status <> 'completed'),"
                    " (SELECT count(*) FROM jobs_job WHERE status = 'processing'),"
                    " (SELECT count(*) FROM pg_stat_activity"
                    "  WHERE datname = current_database() AND pid <> %s)",
                    [own],
                ).fetchone()
                result.connections = max(result.connections, backends)
                if not left:
                    break
                if processing >= full and time.monotonic() - started >= 3:
                    rss, pss, count = tree_memory(cluster.pid)
                    if pss > result.pss_mb:
                        result.rss_mb, result.pss_mb, result.processes = rss, pss, count
                if time.monotonic() - started > 600:
                    raise SystemExit(f"{kind}: not done after 600 s")
                time.sleep(0.2)
            last, twice = conn.execute(
                "SELECT max(completed_at), count(*) FILTER (WHERE attempts > 1) FROM jobs_job"
            ).fetchone()
    finally:
        stop_qcluster(cluster)
    result.seconds, result.twice = (last - committed).total_seconds(), twice
    result.load = load_average()
    return result


def idle_cluster_memory() -> ClusterRound:
    """An idle qcluster of the previous defaults (Q_WORKERS=2, one job per process): the
    median of 5 samples a second apart, after its start-up runs."""
    clear_jobs()
    cluster = start_qcluster(WORKERS, {"JOBS_CONCURRENCY": "1"})
    try:
        time.sleep(2)
        samples = []
        for _ in range(5):
            samples.append(tree_memory(cluster.pid))
            time.sleep(1)
    finally:
        stop_qcluster(cluster)
    rss = statistics.median(s[0] for s in samples)
    pss = statistics.median(s[1] for s in samples)
    return ClusterRound(0.0, 0, rss, pss, samples[-1][2], load=load_average())


def pgqueuer_sleep(jobs: int, dsn: str) -> tuple[float, int]:
    """pgqueuer with its defaults (one QueueManager, drain mode) on `jobs` jobs of
    `await asyncio.sleep(1)`: seconds from the start of its run to its end, and how many ran."""
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def drain() -> tuple[float, int]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            queries = Queries(PsycopgDriver(conn))
            if not await queries.schema_is_installed():
                await queries.install()
            await queries.clear_queue()
            await queries.clear_queue_log()
            await queries.enqueue(["bench.sleep"] * jobs, [None] * jobs, [0] * jobs)
            manager = QueueManager(queries)
            ran = 0

            @manager.entrypoint("bench.sleep")
            async def sleep_1s(job: object) -> None:
                nonlocal ran
                await asyncio.sleep(1)
                ran += 1

            started = time.perf_counter()
            await manager.run(mode=QueueExecutionMode.drain)
            return time.perf_counter() - started, ran
        finally:
            await conn.close()

    return asyncio.run(drain())


def part_qcluster(args: argparse.Namespace, dsn: str) -> None:
    slots = {"JOBS_CONCURRENCY": "50"}
    print(f"qcluster part, load average before: {load_average()}", flush=True)
    idle = idle_cluster_memory()
    blocking = cluster_round("bench.block_1s", args.blocking, slots, full=90)
    asyncs = cluster_round("bench.async_sleep_1s", args.async_jobs, slots, full=500)
    pgq = pgqueuer_sleep(args.async_jobs, dsn) if jobs_bench.pgqueuer_version() else None
    pgq_load = load_average()
    ideal = args.blocking / (WORKERS * 50)
    print(f"\nqcluster Q_WORKERS={WORKERS} JOBS_CONCURRENCY=50 (load average 1/5/15 min)")
    print(
        f"  {args.blocking} blocking jobs (time.sleep(1), atomic=False): {blocking.seconds:.1f} s"
        f" = {blocking.seconds / ideal:.2f} x ideal {ideal:.0f} s (target <= 1.5), "
        f"{blocking.twice} ran twice   [load {blocking.load}]"
    )
    line = (
        f"  {args.async_jobs} async jobs (await asyncio.sleep(1)): {asyncs.seconds:.1f} s "
        f"(target <= 15 s), {asyncs.twice} ran twice   [load {asyncs.load}]"
    )
    print(line)
    if pgq is not None:
        print(
            f"  pgqueuer {jobs_bench.pgqueuer_version()}, defaults, one process, same jobs: "
            f"{pgq[0]:.1f} s, {pgq[1]} ran   [load {pgq_load}]"
        )
    print(
        f"  memory, idle qcluster (JOBS_CONCURRENCY=1): RSS {idle.rss_mb:.0f} MB, "
        f"PSS {idle.pss_mb:.0f} MB, {idle.processes} processes   [load {idle.load}]"
    )
    for name, each in (("100 blocking slots busy", blocking), ("async tasks busy", asyncs)):
        print(
            f"  memory, {name}: RSS {each.rss_mb:.0f} MB ({each.rss_mb / idle.rss_mb:.2f} x), "
            f"PSS {each.pss_mb:.0f} MB ({each.pss_mb / idle.pss_mb:.2f} x; target <= 1.3), "
            f"{each.processes} processes; at most {each.connections} connections "
            f"(target <= {3 * WORKERS + 5})"
        )


# --- part noop ------------------------------------------------------------------------------


@dataclass
class Drain:
    name: str
    run: Callable[[int], jobs_bench.Round]
    rounds: list[jobs_bench.Round] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.rounds)

    def cpu(self) -> float:
        return self.median("worker_us") + self.median("server_us")


def measured(count: int, dsn: str, body: Callable[[], object]) -> jobs_bench.Round:
    """Wall time, this process's CPU (the sampler's thread left out) and every backend's."""
    with BackendCpu(dsn) as backends:
        wall, cpu = time.perf_counter(), time.process_time()
        body()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    cpu -= backends.own_cpu
    return jobs_bench.Round(count / wall, cpu / count * 1e6, backends.seconds / count * 1e6)


def drain_runner(count: int, dsn: str, kind: str, concurrency: int) -> jobs_bench.Round:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_jobattempt")
    counters_roll_up()
    jobs_bench.fill("jobs_job", count, also_vacuum=COUNTER_TABLES, kind=kind)
    result = {}

    def body() -> None:
        with override_settings(JOBS_CONCURRENCY=concurrency):
            result["summary"] = run_pending()

    round_ = measured(count, dsn, body)
    assert result["summary"].completed == count, result["summary"]
    return round_


def drain_bare(count: int, dsn: str, batch: int, async_commit: bool) -> jobs_bench.Round:
    # bench/jobs.py's loop meters its one backend; the same figures here (one connection).
    return jobs_bench.bench_bare(count, dsn, batch, async_commit=async_commit)


def part_noop(args: argparse.Namespace, dsn: str) -> None:
    jobs_bench.prepare_bare_table()
    default, idem = "bench.noop_default", "bench.noop"
    drains = [
        Drain("default kind, JOBS_CONCURRENCY=1", lambda n: drain_runner(n, dsn, default, 1)),
        Drain("default kind, JOBS_CONCURRENCY=10", lambda n: drain_runner(n, dsn, default, 10)),
        Drain("default kind, JOBS_CONCURRENCY=20", lambda n: drain_runner(n, dsn, default, 20)),
        Drain("idempotent, JOBS_CONCURRENCY=1", lambda n: drain_runner(n, dsn, idem, 1)),
        Drain("idempotent, JOBS_CONCURRENCY=10", lambda n: drain_runner(n, dsn, idem, 10)),
        Drain("bare loop, claim 1, sync", lambda n: drain_bare(n, dsn, 1, False)),
        Drain("bare loop, claim 20, async", lambda n: drain_bare(n, dsn, 20, True)),
    ]
    version = jobs_bench.pgqueuer_version()
    if version is not None:
        drains.append(
            Drain(f"pgqueuer {version}, defaults", lambda n: jobs_bench.bench_pgqueuer(n, dsn))
        )
    print(f"noop part, load average before: {load_average()}", flush=True)
    for drain in drains:  # warm-up: imports, connections, plans, pgqueuer's schema
        drain.run(min(args.noop_jobs, 500))
    for round_no in range(args.rounds):
        shift = round_no % len(drains)
        for drain in drains[shift:] + drains[:shift]:
            drain.rounds.append(drain.run(args.noop_jobs))
            drain.loads.append(load_average().split()[0])
    print(
        f"\nno-op jobs, one process, {args.noop_jobs} jobs x {args.rounds} rounds (medians); "
        f"load average after {load_average()}"
    )
    print(f"  {'':36}{'jobs/s':>8}{'worker':>8}{'server':>8}{'total':>8}   rounds (jobs/s @ load)")
    for drain in drains:
        rounds = ", ".join(
            f"{r.rate:.0f} @ {load}" for r, load in zip(drain.rounds, drain.loads, strict=True)
        )
        print(
            f"  {drain.name:36}{drain.median('rate'):8.0f}{drain.median('worker_us'):8.0f}"
            f"{drain.median('server_us'):8.0f}{drain.cpu():8.0f}   {rounds}"
        )
    by = {d.name: d for d in drains}
    d1, d10, d20 = (by[f"default kind, JOBS_CONCURRENCY={n}"] for n in (1, 10, 20))
    i1, i10 = by["idempotent, JOBS_CONCURRENCY=1"], by["idempotent, JOBS_CONCURRENCY=10"]
    sync1, async20 = by["bare loop, claim 1, sync"], by["bare loop, claim 20, async"]
    print("  (CPU in µs per job: this process, every backend of the database, their sum)")
    print(
        f"  default kind, 20 / 1 slots: {d20.median('rate') / d1.median('rate'):.2f} x "
        "(target >= 3)"
    )
    print(
        f"  default kind CPU / claim-1 sync loop's: 10 slots {d10.cpu() / sync1.cpu():.2f}, "
        f"20 slots {d20.cpu() / sync1.cpu():.2f}, 1 slot {d1.cpu() / sync1.cpu():.2f} "
        "(target <= 2)"
    )
    print(
        f"  idempotent CPU / claim-20 async loop's: 1 slot {i1.cpu() / async20.cpu():.2f}, "
        f"10 slots {i10.cpu() / async20.cpu():.2f} (target <= 2)"
    )
    if version is not None:
        pgq = drains[-1].median("rate")
        print(
            f"  / pgqueuer: default kind 10 slots {d10.median('rate') / pgq:.2f}, 20 slots "
            f"{d20.median('rate') / pgq:.2f}, 1 slot {d1.median('rate') / pgq:.2f} "
            f"(target >= 1); idempotent 1 slot {i1.median('rate') / pgq:.2f}, 10 slots "
            f"{i10.median('rate') / pgq:.2f} (target >= 1.5)"
        )
    jobs_bench.drop_bare_table()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("qcluster", "noop", "all"), default="all")
    parser.add_argument("--blocking", type=int, default=1000)
    parser.add_argument("--async-jobs", type=int, default=5000)
    parser.add_argument("--noop-jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    dsn = dsn_from_settings()
    if jobs_bench.pgqueuer_version() is None:
        print("pgqueuer not installed: .venv/bin/pip install 'pgqueuer==1.6.*' to compare")
    if args.part in ("qcluster", "all"):
        part_qcluster(args, dsn)
    if args.part in ("noop", "all"):
        part_noop(args, dsn)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job, jobs_jobattempt")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
