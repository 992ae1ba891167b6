"""Where a throwaway cluster's time goes, per window (bench/hot_rows.py, issue 36 point 2).

A synchronous producer's commit waits for its INSERT, for the WAL flush that makes it
durable, and for a CPU to run on between the two; next to a pinned snapshot each of them
can grow. Instead of guessing, the bench samples, for each window:

- the WAL the whole cluster wrote (`pg_current_wal_lsn()` and `pg_stat_wal` deltas: bytes,
  records, full-page images, fsyncs), to divide by the jobs of the window;
- the runner's statements (`pg_stat_user_functions` for `jobs_runner_step*`: the bench
  sets `track_functions = 'pl'` on its database before anything connects, which times
  each PL/pgSQL call and changes nothing else): calls, and milliseconds a call;
- the CPU of the server's processes by role, from /proc/<pid>/stat (utime + stime), read
  once a second: the runner's backends (their last statement called `jobs_runner_step`),
  the producer's, autovacuum, the rest;
- what the producer's backend was doing, sampled every SAMPLE_SECONDS from
  pg_stat_activity: running (CPU or waiting for one), waiting for the WAL flush (`WALSync`,
  `WALWrite`, the `WALWrite` lock another backend's flush holds), another wait, or idle
  (the time it spends in the client between statements).

None of this needs a restart or a non-default setting besides `track_functions`.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

SAMPLE_SECONDS = 0.02  # the producer's wait event, sampled this often
CPU_SECONDS = 1.0  # the backends' CPU, read this often (a drain's backend may be short-lived)
TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("runner", "producer", "autovacuum", "other")
WAIT_KINDS = ("cpu", "walflush", "otherwait", "idle")


@dataclass
class Costs:
    """One window's figures (deltas over the window)."""

    wal_bytes: int = 0
    wal_records: int = 0
    wal_fpi: int = 0
    wal_syncs: int = 0
    runner_calls: int = 0
    runner_ms: float = 0.0  # total time inside jobs_runner_step* (pg_stat_user_functions)
    cpu: dict[str, float] = field(default_factory=dict)  # role: CPU seconds in the window
    waits: Counter = field(default_factory=Counter)  # the producer's backend, by WAIT_KINDS


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # gone since pg_stat_activity named it
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _role(backend_type: str, application: str, query: str, producer: str) -> str:
    if application == producer:
        return "producer"
    if backend_type.startswith("autovacuum"):
        return "autovacuum"
    if "jobs_runner_step" in query:
        return "runner"
    return "other"


class CostMeter:
    """Samples the cluster in two threads of its own (each with its own connection) and
    hands out one window's `Costs` at each `take()`."""

    def __init__(self, dsn: str, *, producer: str) -> None:
        self.dsn, self.producer = dsn, producer
        self._lock = threading.Lock()
        self._running = True
        self._cpu: dict[str, float] = dict.fromkeys(ROLES, 0.0)
        self._waits: Counter = Counter()
        self._seen: dict[int, float] = {}  # pid: CPU seconds at its last reading
        self._started = False
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._last = self._totals()
        self._threads = [
            threading.Thread(target=self._sample_cpu, daemon=True),
            threading.Thread(target=self._sample_waits, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _totals(self) -> tuple[int, int, int, int, int, float]:
        self._conn.execute("SELECT pg_stat_clear_snapshot()")
        return self._conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0', w.wal_records, w.wal_fpi, w.wal_sync, "
            "coalesce(sum(f.calls), 0)::bigint, coalesce(sum(f.total_time), 0)::float8 "
            "FROM pg_stat_wal AS w LEFT JOIN pg_stat_user_functions AS f "
            "ON f.funcname LIKE 'jobs_runner_step%%' "
            "GROUP BY 1, 2, 3, 4"
        ).fetchone()

    def take(self) -> Costs:
        now = self._totals()
        before, self._last = self._last, now
        with self._lock:
            cpu, self._cpu = self._cpu, dict.fromkeys(ROLES, 0.0)
            waits, self._waits = self._waits, Counter()
        return Costs(
            wal_bytes=int(now[0] - before[0]),
            wal_records=now[1] - before[1],
            wal_fpi=now[2] - before[2],
            wal_syncs=now[3] - before[3],
            runner_calls=now[4] - before[4],
            runner_ms=float(now[5] - before[5]),
            cpu=cpu,
            waits=waits,
        )

    def stop(self) -> None:
        self._running = False
        for thread in self._threads:
            thread.join(5)
        self._conn.close()

    def _sample_cpu(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while self._running:
                rows = conn.execute(
                    "SELECT pid, coalesce(backend_type, ''), coalesce(application_name, ''), "
                    "coalesce(query, '') FROM pg_stat_activity"
                ).fetchall()
                seen: dict[int, float] = {}
                spent: Counter = Counter()
                for pid, backend_type, application, query in rows:
                    now = _cpu_seconds(pid)
                    if now is None:
                        continue
                    seen[pid] = now
                    # A backend first seen after the first reading counts from its start
                    # (a drain's connection: within the last reading); at the first, none.
                    base = self._seen.get(pid, 0.0 if self._started else now)
                    spent[_role(backend_type, application, query, self.producer)] += now - base
                self._seen, self._started = seen, True
                with self._lock:
                    for role, seconds in spent.items():
                        self._cpu[role] += seconds
                time.sleep(CPU_SECONDS)

    def _sample_waits(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while self._running:
                row = conn.execute(
                    "SELECT state, coalesce(wait_event_type, ''), coalesce(wait_event, '') "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    [self.producer],
                ).fetchone()
                if row is not None:
                    state, wait_type, wait = row
                    if state != "active":
                        kind = "idle"
                    elif wait in ("WALSync", "WALWrite") or (
                        wait_type == "LWLock" and wait == "WALWrite"
                    ):
                        kind = "walflush"
                    elif wait_type:
                        kind = "otherwait"
                    else:
                        kind = "cpu"
                    with self._lock:
                        self._waits[kind] += 1
                time.sleep(SAMPLE_SECONDS)
