"""The runner with several slots busy under faults (issue 37, point 5; I4, I5, I21, I22).

A drain with JOBS_CONCURRENCY=4 thread slots and JOBS_ASYNC_CONCURRENCY=2 event-loop slots
over 9 jobs claimed in an order that mixes every way a completion is recorded:
- `faults.slots.record` (atomic, a row in its transaction): completed in its slot, with
  its handler's commit;
- `faults.slots.charge` (a non-idempotent external effect, nothing in the database),
  `faults.slots.own_steps` (`atomic=False`: its own committed step, then an effect) and
  `faults.slots.async_charge` (`async def`, an effect): their completions wait for the
  drain's next statement, durable, and hold their slot until it committed;
- `faults.slots.touch` and `faults.slots.async_touch`, declared idempotent: batched, not
  flushed;
- `faults.slots.fail` (2 attempts).
Handlers started together end together (tests/faults/slot_handlers.py), so the completions
of several slots share one statement and one commit (the clean run shows it:
`shared_commits`).

Invariants, after recovery (the reaper, then drains until done):
- none lost: every job completed (the failing one failed after its 2 attempts); none left
  `processing`;
- each job's effect once: one row per `record` (it commits with its completion), one per
  `own_steps` and `touch`; one external effect per `charge`, `own_steps`, `async_charge`,
  but for the jobs in flight when the process was killed or the server crashed (I21 per
  slot): each started by that process before that moment, at most as many as it has slots
  of that kind; idempotent kinds may run again;
- after a crash of the server (`crash_after`): every completion of a kind not declared
  idempotent that was committed before the crash is still there after the restart (the
  shared commit is durable), and no row is `processing` without a lease;
- attempts: never past max_attempts, each run counted (but a run whose claim the crash
  lost), at most one more than the runs (the reaper's charge).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from jobs import enqueue, run_pending
from jobs.models import Job
from jobs.reaper import jobs_reap_stale
from tests.faults.jobs_scenario import (
    RECOVERY_SECONDS,
    _read,
    crash_snapshot,
    finished_before_the_crash_kept,
)
from tests.support.fault_harness import Scenario

THREADS, ASYNC_TASKS = 4, 2
# (n, kind, max_attempts), claimed in this order (priorities descending)
JOBS = [
    (1, "faults.slots.charge", 3),
    (2, "faults.slots.async_charge", 3),
    (3, "faults.slots.record", 3),
    (4, "faults.slots.own_steps", 3),
    (5, "faults.slots.async_touch", 3),
    (6, "faults.slots.touch", 3),
    (7, "faults.slots.charge", 3),
    (8, "faults.slots.fail", 2),
    (9, "faults.slots.async_charge", 3),
]
ASYNC = {"faults.slots.async_charge", "faults.slots.async_touch"}
IDEMPOTENT = {"faults.slots.touch", "faults.slots.async_touch"}
EXTERNAL = {"faults.slots.charge", "faults.slots.own_steps", "faults.slots.async_charge"}
ROWS = {"faults.slots.record", "faults.slots.own_steps", "faults.slots.touch"}
FAILS = "faults.slots.fail"


class SlotsDrain(Scenario):
    name = "slots"
    settings = {
        "JOBS_CONCURRENCY": THREADS,
        "JOBS_ASYNC_CONCURRENCY": ASYNC_TASKS,
        "JOBS_LEASE_SECONDS": 1.0,
        "JOBS_HEARTBEAT_SECONDS": 0.25,
        "JOBS_BACKOFF_BASE_SECONDS": 0,
        "JOBS_BACKOFF_JITTER": 0,
        "JOBS_EXTRA_HANDLER_MODULES": ["tests.faults.handlers", "tests.faults.slot_handlers"],
    }

    def __init__(self) -> None:
        # The largest number of completions one commit carried, per check (the test
        # process's): the clean run's is the first.
        self.shared_commits: list[int] = []

    def setup(self, workdir: Path) -> dict[str, Any]:
        log = str(workdir / "effects.log")
        ids = {}
        for n, kind, max_attempts in JOBS:
            # The first claim fills the 6 slots with jobs 1-6; the next takes the rest.
            payload = {"log": log, "n": n, "together": 6 if n <= 6 else len(JOBS)}
            job = enqueue(kind, payload, priority=100 - n, max_attempts=max_attempts)
            ids[n] = job.pk
        return {"log": log, "ids": ids}

    def run(self, ctx: dict[str, Any]) -> None:
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(
                status__in=[Job.Status.COMPLETED, Job.Status.FAILED]
            ).exists():
                return
            time.sleep(0.2)

    def crash_snapshot(self, conn) -> dict[str, Any]:
        return crash_snapshot(conn)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        self.shared_commits.append(_largest_shared_commit())
        lines = [line.split() for line in _read(ctx["log"])]
        starts: Counter[int] = Counter()
        effects: Counter[int] = Counter()
        crash = ctx.get("crash")
        # The process whose jobs in flight may run again, and the moment (time.time()).
        disrupted = killed_pid if crash is None else crash["pid"]
        moment = math.inf if crash is None else crash["at"]
        in_flight: set[int] = set()
        for what, n, pid, _slot, at in lines:
            if what == "start":
                starts[int(n)] += 1
                if int(pid) == disrupted and float(at) < moment:
                    in_flight.add(int(n))
            elif what == "effect":
                effects[int(n)] += 1
        rows = Counter(int(n) for n in get_user_model().objects.values_list("last_name", flat=True))
        jobs = {job.pk: job for job in Job.objects.all()}
        violations = []
        reran: dict[str, list[int]] = {"thread": [], "async": []}
        for n, kind, max_attempts in JOBS:
            job = jobs.get(ctx["ids"][n])
            if job is None:
                violations.append(f"job {n} lost")
                continue
            want = Job.Status.FAILED if kind == FAILS else Job.Status.COMPLETED
            if job.status != want:
                violations.append(f"job {n} {kind} ended {job.status}, not {want}")
            once = max_attempts if kind == FAILS else 1
            if kind not in IDEMPOTENT and starts[n] > once:
                if n not in in_flight:
                    violations.append(f"job {n} {kind} ran {starts[n]} times, not in flight")
                reran["async" if kind in ASYNC else "thread"].append(n)
            if kind in EXTERNAL and not 1 <= effects[n] <= 1 + (n in in_flight):
                violations.append(f"job {n} {kind}: external effect {effects[n]} times")
            if kind in ROWS and rows[n] != 1:
                violations.append(f"job {n} {kind}: database effect {rows[n]} times")
            if kind in IDEMPOTENT and starts[n] < 1:
                violations.append(f"job {n} {kind} never ran")
            lost_run = crash is not None and n in in_flight  # its claim may die with it
            if job.attempts > max_attempts:
                violations.append(f"job {n}: attempts {job.attempts} > max {max_attempts}")
            if job.attempts < min(starts[n] - lost_run, max_attempts):
                violations.append(f"job {n}: {starts[n]} runs counted as {job.attempts} attempts")
            if job.attempts > starts[n] + 1:
                violations.append(f"job {n}: {job.attempts} attempts for {starts[n]} runs")
        for pool, numbers in reran.items():
            slots = ASYNC_TASKS if pool == "async" else THREADS
            if len(numbers) > slots:
                violations.append(f"jobs {numbers} ran again: more than the {slots} {pool} slots")
        if crash is not None:
            violations.extend(finished_before_the_crash_kept(crash, idempotent=IDEMPOTENT))
        return violations


def _largest_shared_commit() -> int:
    """The most completions one transaction wrote (rows a transaction last updated share
    its xmin; a finished row is not updated again)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs_job "
            "WHERE status = 'completed' GROUP BY xmin::text) AS commits"
        )
        return cursor.fetchone()[0]


SLOTS_DRAIN = SlotsDrain()
