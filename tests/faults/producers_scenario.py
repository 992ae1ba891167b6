"""Issue 38's new round trips under faults: unique inserts (one job through
`jobs_enqueue_unique`, a bulk insert with keys) and pruning (issue 38, point 9; I22).

The pass: a key a live job holds already is enqueued again, a new key with a period after
completion, a key whose period after completion ran out (its row still there), a key a
pruned job still keeps (`unique_for`), a bulk insert of three keys (one of them the new
key), then a prune in batches of one (old completed, failed and cancelled jobs, and the
expired key). Recovery is what a producer does when it cannot tell whether its statement
committed: it sends the same enqueues again, keyed, so a repeat inserts nothing; then the
next prune. Invariants:
- one job per key (k0 to k4), queued, whatever committed twice; k0's job never replaced;
- no job for k5: the key a completed (and since pruned) job keeps answers with that job;
- pruning deleted exactly the rows past their retention (two old completed, one old failed,
  one old cancelled) and the expired key, kept the recent failed job, every queued job and
  the key still in its period, and recorded a run.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone
from model_bakery import baker

import jobs
from jobs.models import Job, JobPruneRun, JobUniqueKey
from jobs.pruning import jobs_prune
from tests.support.fault_harness import Scenario

KIND = "faults.unique"
KEYS = ("k0", "k1", "k2", "k3", "k4")
KEPT = "k5"  # its job completed with unique_for, and was pruned since: the key outlives it


def _produce() -> None:
    jobs.enqueue(KIND, {"n": 0, "again": True}, unique_key="k0")
    jobs.enqueue(KIND, {"n": 1}, unique_key="k1", unique_for=600)
    jobs.enqueue(KIND, {"n": 4}, unique_key="k4")  # its key's period ran out
    kept = jobs.enqueue(KIND, {"n": 5}, unique_key=KEPT)
    if kept.was_inserted:
        raise AssertionError(f"{KEPT} inserted a job while a completed job keeps the key")
    jobs.enqueue_many(KIND, [{"n": 1}, {"n": 2}, {"n": 3}], unique_keys=["k1", "k2", "k3"])


class Producers(Scenario):
    name = "producers"
    settings = {
        "JOBS_RETENTION_DAYS": 7,
        "JOBS_FAILED_RETENTION_DAYS": 7,
        "JOBS_CANCELLED_RETENTION_DAYS": 7,
    }

    def setup(self, workdir: Path) -> dict[str, Any]:
        old, recent = timezone.now() - timedelta(days=8), timezone.now() - timedelta(days=1)
        done = dict(kind="faults.old", attempts=1, max_attempts=1)
        gone = [
            *baker.make(Job, status="completed", completed_at=old, _quantity=2, **done),
            baker.make(Job, status="cancelled", cancelled_at=old, **done),
        ]
        gone.append(baker.make(Job, status="failed", failed_at=old, **done))
        kept = [baker.make(Job, status="failed", failed_at=recent, **done)]
        live = jobs.enqueue(KIND, {"n": 0}, unique_key="k0")
        hour = timedelta(hours=1)
        expired = JobUniqueKey.objects.create(
            kind=KIND, unique_key="k4", job_id=gone[0].pk, expires_at=timezone.now() - hour
        )
        keeps = JobUniqueKey.objects.create(
            kind=KIND, unique_key=KEPT, job_id=gone[1].pk, expires_at=timezone.now() + hour
        )
        return {
            "gone": [j.pk for j in gone],
            "kept": [j.pk for j in kept],
            "k0": live.pk,
            "expired_key": expired.pk,
            "kept_key": keeps.pk,
        }

    def run(self, ctx: dict[str, Any]) -> None:
        _produce()
        jobs_prune(batch=1)

    def recover(self, ctx: dict[str, Any]) -> None:
        _produce()
        jobs_prune(batch=1)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        violations = []
        rows = list(Job.objects.filter(kind=KIND))
        per_key = Counter(job.unique_key for job in rows)
        for key in KEYS:
            if per_key[key] != 1:
                violations.append(f"key {key}: {per_key[key]} jobs")
        if any(job.status != Job.Status.QUEUED for job in rows):
            violations.append(f"a keyed job not queued: {[(j.pk, j.status) for j in rows]}")
        if Job.objects.get(unique_key="k0").pk != ctx["k0"]:
            violations.append("k0's job was replaced")
        ids = set(Job.objects.values_list("pk", flat=True))
        if ids & set(ctx["gone"]):
            violations.append(f"rows past their retention left: {sorted(ids & set(ctx['gone']))}")
        if set(ctx["kept"]) - ids:
            violations.append("a recent failed job was pruned")
        if not JobPruneRun.objects.exists():
            violations.append("no prune run recorded")
        if per_key[KEPT]:
            violations.append(f"{KEPT}: {per_key[KEPT]} jobs inserted while its key was kept")
        keys = set(JobUniqueKey.objects.values_list("pk", flat=True))
        if ctx["expired_key"] in keys:
            violations.append("the expired unique key was not pruned")
        if ctx["kept_key"] not in keys:
            violations.append(f"the key {KEPT} was pruned within its period")
        return violations


PRODUCERS = Producers()
