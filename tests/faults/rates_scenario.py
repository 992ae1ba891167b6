"""A worker's start (the rates per kind written from code) and a drain of a rate-limited kind
under faults at their round trips (issue 38, points 3 and 9; I22): the rate's sync, and the
runner's statement that takes the kind's token where it claims the job.

Setup: `jobs_kindrate` as a previous release left it (`faults.rated` at 60/s where the code
says 4/s, and the row of a kind no handler has), and 6 jobs of `faults.rated`. The pass is a
worker's start: `kind_rates_sync()` (one statement), then a drain. Recovery is the next start
(the sync again) and the reaper and drains until done. Invariants:
- the table is what the code says (`faults.rated` 4/s, nothing else);
- every job completed; none ran twice but the one in flight when the pass was killed;
- attempts never past max_attempts, and no more than the runs plus one a reaper charged;
- never more than 5 starts (the rate's 4, plus one) in any one second, faults or not.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from jobs import enqueue, run_pending
from jobs.kind_rates import kind_rates_sync
from jobs.models import Job, KindRate
from jobs.reaper import jobs_reap_stale
from tests.faults.jobs_scenario import RECOVERY_SECONDS, JobsDrain, _read

KIND = "faults.rated"
JOBS = 6
PER_SECOND = 4
WANTED = {KIND: "4/s"}  # tests/faults/handlers.py: the rates of the child's code


class RatesStart(JobsDrain):
    name = "rates"

    def setup(self, workdir: Path) -> dict[str, Any]:
        KindRate.objects.create(kind=KIND, rate="60/s", interval_seconds=1 / 60)
        KindRate.objects.create(kind="faults.no_such_handler", rate="2/s", interval_seconds=0.5)
        log = str(workdir / "effects.log")
        ids = {n: enqueue(KIND, {"log": log, "n": n}, max_attempts=3).pk for n in range(JOBS)}
        return {"log": log, "ids": ids}

    def run(self, ctx: dict[str, Any]) -> None:
        kind_rates_sync()  # a failure stops the start, as in `qcluster` and `run_jobs`
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        kind_rates_sync()
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(status=Job.Status.COMPLETED).exists():
                return
            time.sleep(0.05)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        violations = []
        table = dict(KindRate.objects.values_list("kind", "rate"))
        if table != WANTED:
            violations.append(f"jobs_kindrate is {table}, the code says {WANTED}")
        lines = [line.split() for line in _read(ctx["log"])]
        starts = Counter(int(n) for _what, n, _pid, _at in lines)
        killed = [int(n) for _what, n, pid, _at in lines if int(pid) == killed_pid]
        in_flight = killed[-1] if killed else None
        times = sorted(float(at) for _what, _n, _pid, at in lines)
        peak = max((sum(1 for t in times[i:] if t <= s + 1.0) for i, s in enumerate(times)),
                   default=0)  # fmt: skip
        if peak > PER_SECOND + 1:
            violations.append(f"{peak} starts in one second at {PER_SECOND}/s")
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


RATES_START = RatesStart()
