"""A snooze under faults (issue 38, point 2; I22): a drain runs two jobs that each snooze
once (0 s) and complete on their next run, one atomic, one committing its own step.

Invariants, after the reaper and drains as the next processes run them:
- each job completed, having snoozed exactly once (`snoozes` 1, one `snoozed` history row):
  a snooze lost before its commit is made again by the next run, one committed is never
  counted twice;
- the snooze spent no attempt: `attempts` is the runs that did not snooze, plus one the
  reaper may charge for a claim whose process died or whose answer was lost;
- the atomic job's row exists once: the snoozed run's write was rolled back with it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from jobs import enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.reaper import jobs_reap_stale
from tests.faults.jobs_scenario import RECOVERY_SECONDS, JobsDrain, _read

JOBS = [(1, "faults.snooze"), (2, "faults.snooze_own_steps")]


class SnoozeDrain(JobsDrain):
    name = "snooze"

    def setup(self, workdir: Path) -> dict[str, Any]:
        log = str(workdir / "effects.log")
        ids = {n: enqueue(kind, {"log": log, "n": n}, max_attempts=3).pk for n, kind in JOBS}
        return {"log": log, "ids": ids}

    def recover(self, ctx: dict[str, Any]) -> None:
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(status=Job.Status.COMPLETED).exists():
                return
            time.sleep(0.2)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        lines = [line.split() for line in _read(ctx["log"])]
        starts = Counter(int(n) for what, n, _pid, *_ in lines if what == "start")
        rows = Counter(int(n) for n in get_user_model().objects.values_list("last_name", flat=True))
        violations = []
        for n, kind in JOBS:
            job = Job.objects.filter(pk=ctx["ids"][n]).first()
            if job is None or job.status != Job.Status.COMPLETED:
                violations.append(f"job {n} {kind} ended {job and job.status}, not completed")
                continue
            snoozed = JobAttempt.objects.filter(job_id=job.pk, outcome="snoozed").count()
            if job.snoozes != 1 or snoozed != 1:
                violations.append(f"job {n}: snoozes {job.snoozes}, {snoozed} snoozed attempts")
            # Every run but the recorded snooze may count, and one claim the reaper charged.
            if not 1 <= job.attempts <= starts[n] - job.snoozes + 1:
                violations.append(f"job {n}: {job.attempts} attempts for {starts[n]} runs")
            if job.attempts > job.max_attempts:
                violations.append(f"job {n}: attempts {job.attempts} > max {job.max_attempts}")
            if rows[n] != 1:
                violations.append(f"job {n} {kind}: its row written {rows[n]} times")
        return violations


SNOOZE_DRAIN = SnoozeDrain()
