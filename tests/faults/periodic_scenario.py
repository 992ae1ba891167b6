"""A periodic tick under faults (issue 38, point 4; I22): a qcluster's start fires the
latest missed tick of a schedule (its row and its job in one transaction), prunes the
tick rows no key needs any more, and a drain runs the tick's job.

The schedule ticks every 10^8 s since the epoch, so the latest tick (2023-11-14) stays the
same for the whole run (the next is in January 2027); two older ticks are recorded (the
schedule's history: their jobs long pruned). Recovery is the next qcluster's start (catch-up
and pruning again), then the reaper and drains until the job ran. Invariants:
- the latest tick has exactly one row, and exactly one job, whose id the row holds;
- the older ticks are pruned, the latest kept (nothing but it left);
- the job completed, its row (written in its transaction) once; a run its connection's
  error rolled back is retried, as any job's.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from jobs import run_pending
from jobs.models import Job
from jobs.periodic_scheduler import PeriodicScheduler
from jobs.periodic_ticks import Periodic
from jobs.pruning import prune_periodic_ticks
from jobs.reaper import jobs_reap_stale
from project.db_clock import db_now
from tests.faults.jobs_scenario import RECOVERY_SECONDS, JobsDrain, _read

NAME = "faults.every_1e8_s"
EVERY = 10**8
LATEST = datetime.fromtimestamp(17 * EVERY, UTC)
OLDER = [datetime.fromtimestamp(n * EVERY, UTC) for n in (15, 16)]
N = 7  # the tick job's number in the effects log and its row's last_name


def _schedule(ctx: dict[str, Any]) -> Periodic:
    return Periodic(
        name=NAME, kind="faults.record", every=EVERY, payload={"log": ctx["log"], "n": N}
    )


class PeriodicStart(JobsDrain):
    name = "periodic"

    def setup(self, workdir: Path) -> dict[str, Any]:
        with connection.cursor() as cursor:
            # No model: the harness's TRUNCATE of every model's table leaves it as it was.
            cursor.execute("DELETE FROM jobs_periodic_tick")
            for tick in OLDER:
                cursor.execute(
                    "INSERT INTO jobs_periodic_tick (schedule, tick_at, job_id, outcome) "
                    "VALUES (%s, %s, 999999, 'enqueued')",
                    [NAME, tick],
                )
        return {"log": str(workdir / "effects.log")}

    def run(self, ctx: dict[str, Any]) -> None:
        PeriodicScheduler([_schedule(ctx)]).catch_up(db_now())
        prune_periodic_ticks()
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        PeriodicScheduler([_schedule(ctx)]).catch_up(db_now())
        prune_periodic_ticks()
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(status=Job.Status.COMPLETED).exists():
                return
            time.sleep(0.2)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        violations = []
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tick_at, job_id FROM jobs_periodic_tick WHERE schedule = %s "
                "ORDER BY tick_at",
                [NAME],
            )
            ticks = cursor.fetchall()
        jobs = list(Job.objects.filter(kind="faults.record"))
        if [tick for tick, _job in ticks] != [LATEST]:
            violations.append(f"tick rows {[t.isoformat() for t, _j in ticks]}, not the latest")
        if len(jobs) != 1:
            violations.append(f"{len(jobs)} jobs for one tick")
        elif ticks and ticks[-1][1] != jobs[0].pk:
            violations.append(f"the tick's row names job {ticks[-1][1]}, not {jobs[0].pk}")
        for job in jobs:
            if job.status != Job.Status.COMPLETED:
                violations.append(f"the tick's job #{job.pk} ended {job.status}")
        lines = [line.split() for line in _read(ctx["log"])]
        starts = Counter(int(n) for what, n, _pid, *_ in lines if what == "start")
        rows = Counter(get_user_model().objects.values_list("last_name", flat=True))
        if rows[str(N)] != 1:  # its row commits with its completion: once, whatever re-ran
            violations.append(f"the tick's job wrote its row {rows[str(N)]} times")
        for job in jobs:  # each run counted, and one claim the reaper may have charged
            if not 1 <= job.attempts <= min(starts[N] + 1, job.max_attempts):
                violations.append(f"the tick's job: {job.attempts} attempts, {starts[N]} runs")
        return violations


PERIODIC_START = PeriodicStart()
