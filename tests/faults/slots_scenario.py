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
  `own_steps` and `touch`; one external effect per `charge`, `own_steps`, `async_charge`:
  a run that ended well (its effect is its last step) is never run again, whatever fault
  a statement met (a failed run is retried, as it should be), but for the jobs whose run
  ended in the process killed, or before the server crashed, while their completion was
  not yet committed (I21 per slot): at most as many as it has slots of that kind; the
  failing job runs at most its 2 attempts (one more if in flight then); idempotent kinds
  may run again;
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
    runs_the_crash_unclaimed,
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
LATE_DONE = 7
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
            payload = {
                "log": log,
                "n": n,
                "together": 6 if n <= 6 else len(JOBS),
                # Ends after the others of its wave: its own commit, or (job 7) a completion
                # the drain waits for while it polls for due jobs.
                "late": kind in (FAILS, "faults.slots.record") or n == LATE_DONE,
            }
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
        started_before: set[int] = set()  # started by that process before that moment
        ended_before: set[int] = set()  # its first run that ended well came from it, before
        for what, n, pid, _slot, at in lines:
            before = int(pid) == disrupted and float(at) < moment
            if what == "start":
                starts[int(n)] += 1
                if before:
                    started_before.add(int(n))
            elif what == "effect":  # the handler's last step: its run ended well
                if before and not effects[int(n)]:
                    ended_before.add(int(n))
                effects[int(n)] += 1
        rows = Counter(int(n) for n in get_user_model().objects.values_list("last_name", flat=True))
        jobs = {job.pk: job for job in Job.objects.all()}
        unclaimed = runs_the_crash_unclaimed(crash, starts=lines)
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
            # A run that ended well is not run again (I21): its completion is committed
            # before its slot starts another job, whatever fault the statement meets, but
            # for the process killed (or the server crashed) before it was.
            # ... or whose claim the crash lost (an asynchronous commit): run again once.
            again = max(int(n in ended_before), unclaimed[job.pk])
            if kind in EXTERNAL and not 1 <= effects[n] <= 1 + again:
                violations.append(f"job {n} {kind}: external effect {effects[n]} times")
            if kind in EXTERNAL and effects[n] > 1:
                reran["async" if kind in ASYNC else "thread"].append(n)
            if kind == FAILS and starts[n] > max_attempts + max(int(n in started_before), again):
                violations.append(f"job {n} ran {starts[n]} times, max_attempts {max_attempts}")
            if kind in ROWS and rows[n] != 1:
                violations.append(f"job {n} {kind}: database effect {rows[n]} times")
            if kind in IDEMPOTENT and starts[n] < 1:
                violations.append(f"job {n} {kind} never ran")
            # its attempt may die with the crash
            lost_run = max(int(n in started_before), again) if crash is not None else 0
            if job.attempts > max_attempts:
                violations.append(f"job {n}: attempts {job.attempts} > max {max_attempts}")
            if job.attempts < min(starts[n] - lost_run, max_attempts):
                violations.append(f"job {n}: {starts[n]} runs counted as {job.attempts} attempts")
            if job.attempts > starts[n] + 1:
                violations.append(f"job {n}: {job.attempts} attempts for {starts[n]} runs")
        # A completion that must be flushed holds its slot until it is (I21 per slot): what
        # a kill or a crash re-runs is at most one job per slot.
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
