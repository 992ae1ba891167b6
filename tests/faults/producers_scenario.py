"""Issue 38's new round trips under faults: unique inserts (one job through
`jobs_enqueue_unique`, a bulk insert with keys) and pruning (issue 38, point 9; I22).

The pass: a key a live job holds already is enqueued again, a new key with a period after
completion, a bulk insert of three keys (one of them the new key), then a prune. Recovery is
what a producer does when it cannot tell whether its statement committed: it sends the same
enqueues again, keyed, so a repeat inserts nothing; then the next prune. Invariants:
- one job per key (k0, k1, k2, k3), queued, whatever committed twice;
- pruning deleted exactly the rows past their retention (two old completed, one old
  cancelled), kept the recent failed one and every queued job, and recorded a run.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone
from model_bakery import baker

import jobs
from jobs.models import Job, JobPruneRun
from jobs.pruning import jobs_prune
from tests.support.fault_harness import Scenario

KIND = "faults.unique"
KEYS = ("k0", "k1", "k2", "k3")


def _produce() -> None:
    jobs.enqueue(KIND, {"n": 0, "again": True}, unique_key="k0")
    jobs.enqueue(KIND, {"n": 1}, unique_key="k1", unique_for=600)
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
        kept = [baker.make(Job, status="failed", failed_at=recent, **done)]
        live = jobs.enqueue(KIND, {"n": 0}, unique_key="k0")
        return {"gone": [j.pk for j in gone], "kept": [j.pk for j in kept], "k0": live.pk}

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
        return violations


PRODUCERS = Producers()
