"""What bench/against_pgqueuer.py measures besides wall time, from /proc and pg_stat_activity:
the CPU of every PostgreSQL backend of one database (a worker with thread slots has one
connection per busy slot, not one), and the memory of a process tree (a qcluster is a
parent, its django-q2 workers and their helpers).

The server is local (its backends' /proc is readable), as in bench/jobs.py.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psycopg

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def process_cpu(pid: int) -> float | None:
    """Seconds of CPU (user + system) process `pid` has used; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class BackendCpu:
    """The CPU all backends of the database used between `__enter__` and `__exit__`, the
    sampler's own connection left out. Backends are found by polling pg_stat_activity
    every `poll` seconds (a slot's connection may open and close during the run): each
    one's CPU is taken at its first sighting (0 when it was not there at the start: its
    fork and authentication are part of the cost) and at its last. The poll's own CPU in
    this process is `own_cpu` (its thread's), for the caller to subtract."""

    def __init__(self, dsn: str, poll: float = 0.05) -> None:
        self.dsn, self.poll = dsn, poll
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.own_cpu = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-backend-cpu", daemon=True)

    def __enter__(self) -> BackendCpu:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)

    def _run(self) -> None:
        started = time.thread_time()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            own = conn.info.backend_pid
            query = (
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s"
            )
            first_round = True
            while True:
                pids = [row[0] for row in conn.execute(query, [own]).fetchall()]
                for pid in pids:
                    cpu = process_cpu(pid)
                    if cpu is None:
                        continue
                    self.first.setdefault(pid, cpu if first_round else 0.0)
                    self.last[pid] = cpu
                if first_round:
                    first_round = False
                    self._ready.set()
                if self._stop.wait(self.poll):
                    break
            for pid in pids:  # the last reading, after the run
                cpu = process_cpu(pid)
                if cpu is not None:
                    self.last[pid] = cpu
        self.own_cpu = time.thread_time() - started


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def tree_memory(pid: int) -> tuple[float, float, int]:
    """(sum of RSS, sum of PSS) in MB over `pid`'s process tree, and how many processes."""
    rss = pss = 0
    pids = tree(pid)
    for each in pids:
        try:
            for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return rss / 1024, pss / 1024, len(pids)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f}"
