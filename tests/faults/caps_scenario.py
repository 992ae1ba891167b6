"""A worker's start under faults: the caps per kind written from code, then a drain of a
capped kind (issue 37, point 2; I22 for the start-up sync's round trip).

Setup: `jobs_kindcap` as a previous release left it (`faults.capped` at 5 where the code
says 1, and the row of a kind no handler has), and 4 jobs of `faults.capped`. The pass is a
worker's start: `kind_caps_sync()` (one statement), then a drain. Recovery is the next start
(the sync again) and the reaper and drains until done. Invariants:
- the table is what the code says (`faults.capped` 1, nothing else);
- every job completed; none ran twice but the one in flight when the pass was killed;
- attempts never past max_attempts, and no more than the runs plus one a reaper charged.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from jobs import enqueue, run_pending
from jobs.kind_caps import kind_caps_sync
from jobs.models import Job, KindCap
from jobs.reaper import jobs_reap_stale
from tests.faults.jobs_scenario import RECOVERY_SECONDS, JobsDrain, _read

KIND = "faults.capped"
JOBS = 4
WANTED = {KIND: 1}  # tests/faults/handlers.py: the caps of the child's code


class CapsStart(JobsDrain):
    name = "caps"

    def setup(self, workdir: Path) -> dict[str, Any]:
        KindCap.objects.create(kind=KIND, concurrency=5)
        KindCap.objects.create(kind="faults.no_such_handler", concurrency=2)
        log = str(workdir / "effects.log")
        ids = {n: enqueue(KIND, {"log": log, "n": n}, max_attempts=3).pk for n in range(JOBS)}
        return {"log": log, "ids": ids}

    def run(self, ctx: dict[str, Any]) -> None:
        kind_caps_sync()  # a failure stops the start, as in `qcluster` and `run_jobs`
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        kind_caps_sync()
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(status=Job.Status.COMPLETED).exists():
                return
            time.sleep(0.2)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        violations = []
        table = dict(KindCap.objects.values_list("kind", "concurrency"))
        if table != WANTED:
            violations.append(f"jobs_kindcap is {table}, the code says {WANTED}")
        lines = [line.split() for line in _read(ctx["log"])]
        starts = Counter(int(n) for what, n, _pid, _at in lines if what == "start")
        killed = [
            int(n) for what, n, pid, _at in lines if what == "start" and int(pid) == killed_pid
        ]
        in_flight = killed[-1] if killed else None
        jobs = {job.pk: job for job in Job.objects.filter(kind=KIND)}
        for n, pk in ctx["ids"].items():
            job = jobs.get(pk)
            if job is None or job.status != Job.Status.COMPLETED:
                violations.append(f"job {n} ended {job and job.status}, not completed")
                continue
            if starts[n] > 1 + (n == in_flight):
                violations.append(f"job {n} ran {starts[n]} times")
            if job.attempts > job.max_attempts or job.attempts > starts[n] + 1:
                violations.append(f"job {n}: {job.attempts} attempts for {starts[n]} runs")
        return violations


CAPS_START = CapsStart()
