"""Next to a long transaction, enqueue stays fast (issue 32): a producer at 1,000 jobs/s by
plain SQL INSERT, a real qcluster with 2 workers, and another session holding a REPEATABLE
READ snapshot for minutes, on a throwaway PostgreSQL with its own defaults (autovacuum on).

Usage (as root or any user; the cluster runs as `postgres` when started by root):

    .venv/bin/python bench/hot_rows.py [--minutes 10] [--rate 1000] [--workers 2]
        [--code PATH]   # run another checkout's code (e.g. a worktree of main), same venv
        [--async-commit]  # the producer commits without waiting for the WAL flush

It initdb's a cluster in a temporary folder (/usr/lib/postgresql/15/bin, a free port),
migrates it with the code under test, starts `manage.py qcluster` there, then: 30 s
unpinned, the pinned phase (`--minutes`), 30 s after the snapshot is released. Per 15 s
window it prints the producer's rate, the INSERT p95, insert→start p95 (`started_at −
created_at` of the jobs inserted in the window), the backlog (queued rows at the window's
end), how long the runner's due scan for a batch of 20 takes (EXPLAIN ANALYZE), the load
average, and the dead tuples (pg_stat_user_tables) of jobs_job and of the
counter tables. Targets in every pinned window: rate ≥ 90 % of --rate, INSERT p95 ≤ 20 ms,
insert→start p95 < 1 s, backlog < 2 s of arrivals. Everything it started is stopped and the
folder removed at the end.

The producer commits synchronously (`synchronous_commit` on, as a web request does; issue
36, point 2), unless `--async-commit`; the report says which. A second table says where the
time went per window (bench/pg_costs.py: the cluster's WAL per job, the runner's calls and
its backends' CPU per job, the producer backend's share of time waiting for the WAL flush),
and the verdict holds every pinned window to issue 36's targets: INSERT p95 at most 1.5 ×
the unpinned one (the warm-up's windows but the first), and at least 90 % of the rate.
Runner settings (`JOBS_…`) set in the environment reach the qcluster and are printed.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.pg_costs import WAIT_KINDS, CostMeter, Costs  # noqa: E402
from bench.support import COUNTER_TABLES, stop_qcluster  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")
WINDOW = 15.0  # seconds
KIND = "bench.noop"  # registered by bench/handlers.py in the qcluster's workers
INSERT = (
    "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after, "
    "created_at, locked_by, last_error) VALUES (%s, '{}', 'queued', 0, 0, 3, now(), "
    "clock_timestamp(), '', '') RETURNING id"
)
# The runner's due scan (jobs_runner_step's `due`, without its locks): how long finding a batch
# takes while the dead index entries of claimed jobs cannot be removed. Code with migration
# jobs/0017 scans by lane as the claim does (`jobs_first_due_v1`, the listener's and the linger
# poll's statement); older code (`--code`) the whole claim index, as its claim did.
DUE_SCAN_BY_LANE = (
    "EXPLAIN (ANALYZE, FORMAT JSON) SELECT jobs_first_due_v1('-infinity', clock_timestamp())"
)
DUE_SCAN = (
    "EXPLAIN (ANALYZE, FORMAT JSON) SELECT j.id FROM jobs_job AS j WHERE j.status = 'queued' "
    "AND j.run_after <= clock_timestamp() AND j.attempts < j.max_attempts "
    "ORDER BY j.priority DESC, j.run_after, j.id LIMIT 20"
)
# The same scan from a floor 1 s back (what the runner's claims do between full scans, issue
# 32 point 1, jobs/claim_floor.py: its floor is the oldest due row it saw, less
# JOBS_CLAIM_FLOOR_MARGIN_SECONDS): the bound is an Index Cond, the dead entries below it
# cost no heap visit.
FLOORED_SCAN_BY_LANE = DUE_SCAN_BY_LANE.replace(
    "'-infinity'", "statement_timestamp() - interval '1 second'"
)
FLOORED_SCAN = DUE_SCAN.replace(
    "j.run_after <= clock_timestamp()",
    "j.run_after <= statement_timestamp() "
    "AND j.run_after >= statement_timestamp() - interval '1 second'",
)
TABLES = ("jobs_job", *COUNTER_TABLES)
PRODUCER = "bench-producer"  # the producer's application_name (bench/pg_costs.py samples it)


@dataclass
class Window:
    phase: str
    inserted: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds per INSERT
    first_id: int | None = None
    last_id: int | None = None
    backlog: int = 0
    claim_scan: float = 0.0  # seconds: the runner's due scan for a batch of 20, EXPLAIN ANALYZE
    floored_scan: float = 0.0  # seconds: the same from a floor 1 s back
    load: float = 0.0
    dead: dict[str, tuple[int, int]] = field(default_factory=dict)  # table: (live, dead)
    start_p95: float | None = None
    unstarted: int = 0
    costs: Costs = field(default_factory=Costs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Cluster:
    """A throwaway PostgreSQL 15 cluster with the server's defaults (autovacuum on)."""

    def __init__(self, *, explain_ms: float | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hot-rows-"))
        self.explain_ms = explain_ms
        self.port = _free_port()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        subprocess.run(
            _as_postgres(
                [str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        if explain_ms is not None:
            # Where a statement's time goes, inside the runner's function too: the plans of
            # its nested statements that took at least explain_ms, with their buffers.
            options += (
                " -c shared_preload_libraries=auto_explain"
                f" -c auto_explain.log_min_duration={explain_ms:g}"
                " -c auto_explain.log_nested_statements=on -c auto_explain.log_analyze=on"
                " -c auto_explain.log_buffers=on -c auto_explain.log_timing=off"
            )
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "pg_ctl"),
                    "-D",
                    str(data),
                    "-o",
                    options,
                    "-l",
                    str(self.dir / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/bench"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
            # bench/pg_costs.py times the runner's calls (pg_stat_user_functions).
            conn.execute("ALTER DATABASE bench SET track_functions = 'pl'")
            self.autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]

    def dsn(self, db: str = "bench") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={db}"

    def stop(self) -> None:
        if self.explain_ms is not None:
            kept = ROOT / "var" / f"hot_rows-explain-{time.strftime('%Y%m%d-%H%M%S')}.log"
            kept.parent.mkdir(exist_ok=True)
            shutil.copyfile(self.dir / "log", kept)
            print(f"hot_rows: the server's log with the slow statements' plans: {kept}")
        subprocess.run(
            _as_postgres(
                [str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop"]
            ),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def _env(code: Path, url: str, workers: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        Q_WORKERS=str(workers),
        JOBS_EXTRA_HANDLER_MODULES="bench.handlers",
        PYTHONPATH=str(code),
        LOG_LEVEL="WARNING",
        DEBUG="false",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-" + "x" * 40),
    )
    return env


def start_qcluster(code: Path, env: dict[str, str], dsn: str) -> subprocess.Popen:
    cluster = subprocess.Popen(
        [sys.executable, str(code / "manage.py"), "qcluster"],
        env=env,
        cwd=code,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'jobs-wake-listener'"
        ).fetchone():
            if cluster.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("qcluster did not start")
            time.sleep(0.2)
    time.sleep(3)
    return cluster


class Producer(threading.Thread):
    """One connection inserting one job per statement (autocommit) at a steady rate; each
    INSERT's time and id go to the window open when it was sent."""

    def __init__(self, dsn: str, rate: float, *, sync_commit: bool) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.sync_commit = dsn, rate, sync_commit
        self.window = Window("warm-up")
        self.running = True

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name=PRODUCER) as conn:
            if not self.sync_commit:
                conn.execute("SET synchronous_commit = off")
            start, i = time.perf_counter(), 0
            while self.running:
                delay = start + i / self.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                window = self.window
                sent = time.perf_counter()
                (job_id,) = conn.execute(INSERT, [KIND]).fetchone()
                window.latencies.append(time.perf_counter() - sent)
                window.inserted += 1
                window.first_id = window.first_id or job_id
                window.last_id = job_id
                i += 1


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _sample(conn: psycopg.Connection, window: Window) -> None:
    window.backlog = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE status = 'queued' AND run_after <= now()"
    ).fetchone()[0]
    window.load = os.getloadavg()[0]
    by_lane = conn.execute(
        "SELECT to_regprocedure('jobs_first_due_v1(timestamptz, timestamptz)') IS NOT NULL"
    ).fetchone()[0]
    plan = conn.execute(DUE_SCAN_BY_LANE if by_lane else DUE_SCAN).fetchone()[0]
    window.claim_scan = plan[0]["Execution Time"] / 1000
    plan = conn.execute(FLOORED_SCAN_BY_LANE if by_lane else FLOORED_SCAN).fetchone()[0]
    window.floored_scan = plan[0]["Execution Time"] / 1000
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        [list(TABLES)],
    ).fetchall()
    window.dead = {name: (live, dead) for name, live, dead in rows}


def _starts(conn: psycopg.Connection, windows: list[Window]) -> None:
    for w in windows:
        if w.first_id is None:
            continue
        waits = [
            wait
            for (wait,) in conn.execute(
                "SELECT extract(epoch FROM started_at - created_at)::float8 FROM jobs_job "
                "WHERE id BETWEEN %s AND %s AND started_at IS NOT NULL",
                [w.first_id, w.last_id],
            ).fetchall()
        ]
        w.unstarted = w.inserted - len(waits)
        w.start_p95 = math.inf if w.unstarted > 0.05 * w.inserted else _p95(waits)


def _fmt(value: float | None, scale: float = 1000, width: int = 9, digits: int = 1) -> str:
    if value is None:
        return f"{'—':>{width}}"
    if value == math.inf:
        return f"{'never':>{width}}"
    return f"{value * scale:{width}.{digits}f}"


def _baseline(windows: list[Window]) -> tuple[float | None, float]:
    """The unpinned figures the pinned windows are held to: the INSERT p95 over every
    warm-up window but the first (the cluster's start-up), and their mean rate."""
    warm = [w for w in windows if w.phase == "warm-up"]
    warm = warm[1:] if len(warm) > 1 else warm
    latencies = [t for w in warm for t in w.latencies]
    return _p95(latencies), sum(w.inserted for w in warm) / (WINDOW * max(1, len(warm)))


def report(windows: list[Window], rate: float, args: argparse.Namespace, cluster: Cluster) -> bool:
    commit = "on (synchronous)" if not args.async_commit else "off (asynchronous)"
    print(
        f"\nhot rows: producer {rate:g} jobs/s by plain INSERT, qcluster of {args.workers} "
        f"workers, REPEATABLE READ snapshot held {args.minutes:g} min; code {args.code}; "
        f"PostgreSQL autovacuum={cluster.autovacuum}, producer synchronous_commit="
        f"{commit}; {WINDOW:g} s windows"
    )
    overrides = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("JOBS_"))
    print("runner settings from the environment: " + (", ".join(overrides) or "none (defaults)"))
    short = {t: t.split("_", 1)[1][:11] for t in TABLES}
    print(
        f"{'phase':<8}{'t s':>6}{'jobs/s':>8}{'ins p95':>9}{'start p95':>10}{'backlog':>8}"
        f"{'claim':>7}{'floor':>7}{'load':>6}  " + " ".join(f"{short[t]:>11}" for t in TABLES)
    )
    print(
        f"{'':<8}{'':>6}{'':>8}{'ms':>9}{'ms':>10}{'rows':>8}{'ms':>7}{'ms':>7}{'1min':>6}  "
        "dead tuples (live); jobs_job: dead only"
    )
    ok = True
    for n, w in enumerate(windows):
        produced = w.inserted / WINDOW
        ins = _p95(w.latencies)
        if w.phase == "pinned":
            ok &= produced >= 0.9 * rate and (ins or 0) <= 0.020
            ok &= w.start_p95 is not None and w.start_p95 < 1.0 and w.backlog < 2 * rate
        dead = " ".join(
            f"{w.dead.get(t, (0, 0))[1]:>6}({w.dead.get(t, (0, 0))[0]:>3})"
            if t != "jobs_job"
            else f"{w.dead.get(t, (0, 0))[1]:>11}"
            for t in TABLES
        )
        print(
            f"{w.phase:<8}{(n + 1) * WINDOW:6.0f}{produced:8.0f}{_fmt(ins, digits=2)}"
            f"{_fmt(w.start_p95, width=10, digits=0)}{w.backlog:8d}"
            f"{w.claim_scan * 1000:7.1f}{w.floored_scan * 1000:7.1f}{w.load:6.1f}  {dead}"
        )
    print(
        "targets in the pinned phase: jobs/s >= 90 % of the rate, INSERT p95 <= 20 ms, "
        "insert→start p95 < 1 s, backlog < 2 s of arrivals: " + ("MET" if ok else "NOT MET")
    )
    _report_costs(windows)
    return _verdict(windows, rate, commit) and ok


def _report_costs(windows: list[Window]) -> None:
    """Where the time went (bench/pg_costs.py): the cluster's WAL per job, the runner's
    statements, the CPU of the server's processes by role, the producer backend's state."""
    print(
        "\nwhere the time went, per window: WAL of the whole cluster per job inserted; the "
        "runner's statements (jobs_runner_step*: wall ms a call) and its backends' CPU a call "
        "and a job; CPU of the server's processes in % of one core; the producer's backend, "
        "sampled every 20 ms"
    )
    print(
        f"{'phase':<8}{'t s':>6}{'WAL B':>7}{'recs':>6}{'FPI':>6}{'fsync':>7}"
        f"{'calls':>7}{'jobs':>6}{'ms':>6}{'cpu ms':>7}{'runner':>7}{'runner':>7}{'prod':>6}"
        f"{'autovac':>8}{'other':>6}  " + " ".join(f"{k:>9}" for k in WAIT_KINDS)
    )
    print(
        f"{'':<8}{'':>6}{'/job':>7}{'/job':>6}{'/job':>6}{'/s':>7}{'/s':>7}{'/call':>6}"
        f"{'/call':>6}{'/call':>7}{'µs/job':>7}{'%':>7}{'%':>6}{'%':>8}{'%':>6}"
        "  producer backend, % of samples"
    )
    for n, w in enumerate(windows):
        c, jobs = w.costs, max(1, w.inserted)
        samples = max(1, sum(c.waits.values()))
        cpu = {role: 100 * seconds / WINDOW for role, seconds in c.cpu.items()}
        print(
            f"{w.phase:<8}{(n + 1) * WINDOW:6.0f}{c.wal_bytes / jobs:7.0f}"
            f"{c.wal_records / jobs:6.1f}{c.wal_fpi / jobs:6.2f}{c.wal_syncs / WINDOW:7.0f}"
            f"{c.runner_calls / WINDOW:7.0f}{w.inserted / max(1, c.runner_calls):6.1f}"
            f"{c.runner_ms / max(1, c.runner_calls):6.2f}"
            f"{1000 * c.cpu.get('runner', 0) / max(1, c.runner_calls):7.2f}"
            f"{1e6 * c.cpu.get('runner', 0) / jobs:7.0f}{cpu.get('runner', 0):7.0f}"
            f"{cpu.get('producer', 0):6.0f}{cpu.get('autovacuum', 0):8.0f}"
            f"{cpu.get('other', 0):6.0f}  "
            + " ".join(f"{100 * c.waits[k] / samples:9.0f}" for k in WAIT_KINDS)
        )


def _verdict(windows: list[Window], rate: float, commit: str) -> bool:
    """Issue 36, point 2: in every pinned window the INSERT p95 is at most 1.5 × the
    unpinned one and the connection keeps 90 % of its rate (of --rate, or of what it kept
    unpinned when the machine could not give it that much)."""
    p95, kept = _baseline(windows)
    pinned = [w for w in windows if w.phase == "pinned"]
    if p95 is None or not pinned:
        print("verdict: no unpinned or no pinned window")
        return False
    goal = 0.9 * min(rate, kept)
    worst_p95 = max(_p95(w.latencies) or math.inf for w in pinned)
    worst_rate = min(w.inserted / WINDOW for w in pinned)
    all_p95 = _p95([t for w in pinned for t in w.latencies])
    slow = sum((_p95(w.latencies) or math.inf) > 1.5 * p95 for w in pinned)
    short = sum(w.inserted / WINDOW < goal for w in pinned)
    print(
        f"\nverdict (issue 36, point 2), producer synchronous_commit={commit}: unpinned "
        f"INSERT p95 {p95 * 1000:.2f} ms at {kept:.0f} jobs/s; pinned p95 {all_p95 * 1000:.2f} "
        f"ms over the whole pin, worst window {worst_p95 * 1000:.2f} ms "
        f"({worst_p95 / p95:.2f} ×, target <= 1.5 ×; {slow} of {len(pinned)} windows above); "
        f"slowest window {worst_rate:.0f} jobs/s (target >= {goal:.0f}; {short} below): "
        + ("MET" if not slow and not short else "NOT MET")
    )
    return not slow and not short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the snapshot is held")
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs/s the producer inserts")
    parser.add_argument("--workers", type=int, default=2, help="Q_WORKERS of the qcluster")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose code runs")
    parser.add_argument(
        "--warm-up", type=float, default=60.0, help="seconds before the pin (the baseline)"
    )
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="the producer's session sets synchronous_commit off, so its rate measures the "
        "rows, not the WAL flush (default: on, as a web request commits)",
    )
    parser.add_argument(
        "--explain-ms",
        type=float,
        default=None,
        help="log the plan and buffers of every statement (the runner's nested ones too) that "
        "takes at least this many ms (auto_explain; its instrumentation slows every statement, "
        "so the figures of such a run are for where the time goes, not for the verdict)",
    )
    args = parser.parse_args()
    code = args.code.resolve()
    # A SIGTERM (or a SIGINT where a background shell ignores it) stops the bench through
    # its `finally`: the qcluster and the throwaway cluster go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("hot_rows: terminated"))

    cluster = Cluster(explain_ms=args.explain_ms)
    qcluster = None
    producer = None
    try:
        env = _env(code, cluster.url, args.workers)
        subprocess.run(
            [sys.executable, str(code / "manage.py"), "migrate", "-v", "0"],
            env=env,
            cwd=code,
            check=True,
        )
        qcluster = start_qcluster(code, env, cluster.dsn())
        producer = Producer(cluster.dsn(), args.rate, sync_commit=not args.async_commit)
        meter = CostMeter(cluster.dsn(), producer=PRODUCER)
        monitor = psycopg.connect(cluster.dsn(), autocommit=True)
        pin = psycopg.connect(cluster.dsn(), application_name="bench-long-report")
        windows: list[Window] = []
        plan = [("warm-up", args.warm_up)] + [("pinned", args.minutes * 60)] + [("released", 30.0)]
        producer.start()
        for phase, seconds in plan:
            if phase == "pinned":
                pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pin.execute("SELECT count(*) FROM jobs_job").fetchone()
            if phase == "released":
                pin.rollback()
            for _ in range(max(1, round(seconds / WINDOW))):
                window = Window(phase)
                producer.window = window
                time.sleep(WINDOW)
                _sample(monitor, window)
                window.costs = meter.take()
                windows.append(window)
                print(
                    f"  {phase} {len(windows) * WINDOW:.0f} s: {window.inserted / WINDOW:.0f}/s, "
                    f"backlog {window.backlog}, load {window.load:.1f}",
                    flush=True,
                )
        producer.running = False
        producer.join(10)
        meter.stop()
        deadline = time.monotonic() + 60
        while (
            monitor.execute("SELECT count(*) FROM jobs_job WHERE status = 'queued'").fetchone()[0]
            and time.monotonic() < deadline
        ):
            time.sleep(1)
        _starts(monitor, windows)
        pin.close()
        monitor.close()
        report(windows, args.rate, args, cluster)
    finally:
        if producer is not None:
            producer.running = False
        if qcluster is not None:
            stop_qcluster(qcluster)
        cluster.stop()


if __name__ == "__main__":
    main()
