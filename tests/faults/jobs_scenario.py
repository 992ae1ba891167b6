"""The job runner under faults: a drain of 6 jobs, then the reaper and drains until done.

Jobs: two quick ones with a database effect, a non-idempotent one with an external effect
only (its completion goes with the batch), one of 0.2 s (long enough for the keeper to give
the rest back), one that commits its own step then has an external effect (`atomic=False`),
and one that fails (2 attempts). Invariants (I4, I5, I21):
- every job ends completed (the failing one: failed after its 2 attempts);
- no external or database effect happens twice, but for the job in flight when the process
  was killed (I21: only that one may re-run);
- attempts: each run counted, never past max_attempts; more than the runs only when the
  reaper charged a claim whose process died or whose answer was lost;
- no job lost;
- under `crash_after` (the server stopped at once, then started again): the job in flight
  at the crash counts as the killed pass's; every completion committed before the crash of
  a kind not declared idempotent is there after the restart.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from jobs import enqueue, run_pending
from jobs.models import Job, JobAttempt
from jobs.reaper import jobs_reap_stale
from tests.support.fault_harness import FIRED_FILE, Scenario

# (n, kind, payload extras, priority, max_attempts): claimed in this order
JOBS = [
    (1, "faults.record", {}, 60, 3),
    (2, "faults.record", {}, 50, 3),
    (3, "faults.charge", {}, 45, 3),
    (4, "faults.record", {"sleep": 0.2}, 40, 3),
    (5, "faults.own_steps", {}, 30, 3),
    (6, "faults.fail", {}, 20, 2),
]
EXTERNAL = {"faults.charge", "faults.own_steps"}
DATABASE = {"faults.record", "faults.own_steps"}
RECOVERY_SECONDS = 20.0


class JobsDrain(Scenario):
    """`slow_ends_at_fault`: the slow job ends as soon as the fault cuts a connection (the
    moment the keeper's failed statement waits for its retry). `hold`:
    JOBS_HOLD_UNSTARTED_SECONDS, when the keeper gives unstarted jobs back."""

    name = "jobs"

    def __init__(self, *, slow_ends_at_fault: bool = False, hold: float | None = None) -> None:
        self.slow_ends_at_fault = slow_ends_at_fault
        self.hold = hold

    def child_settings(self, ctx: dict[str, Any]) -> dict[str, Any]:
        if self.hold is None:
            return dict(self.settings)
        return {**self.settings, "JOBS_HOLD_UNSTARTED_SECONDS": self.hold}

    settings = {
        "JOBS_LEASE_SECONDS": 1.0,
        "JOBS_HEARTBEAT_SECONDS": 0.25,
        "JOBS_BACKOFF_BASE_SECONDS": 0,
        "JOBS_BACKOFF_JITTER": 0,
        "JOBS_EXTRA_HANDLER_MODULES": ["tests.faults.handlers"],
        # The one-slot drain, whose round trips (handlers' included) are the drain's own
        # connection's: what these scenarios enumerate. A scenario with several slots busy
        # is issue 37, point 5's.
        "JOBS_CONCURRENCY": 1,
    }

    def setup(self, workdir: Path) -> dict[str, Any]:
        log = str(workdir / "effects.log")
        ids = {}
        for n, kind, extra, priority, max_attempts in JOBS:
            if self.slow_ends_at_fault and "sleep" in extra:
                # Long enough for the keeper's give-back at `hold`, and its retry (half a hold
                # later) after the drain went on.
                extra = {"sleep": 1.0, "until": str(workdir / FIRED_FILE)}
            job = enqueue(
                kind, {"log": log, "n": n, **extra}, priority=priority, max_attempts=max_attempts
            )
            ids[n] = job.pk
        return {"log": log, "ids": ids}

    def run(self, ctx: dict[str, Any]) -> None:
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        """What the next processes do: reap what a dead drain held (after its lease), drain."""
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            run_pending()
            if not Job.objects.exclude(
                status__in=[Job.Status.COMPLETED, Job.Status.FAILED]
            ).exists():
                return
            time.sleep(0.2)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        lines = [line.split() for line in _read(ctx["log"])]
        starts = Counter(int(n) for what, n, _pid, _at in lines if what == "start")
        effects = Counter(int(n) for what, n, _pid, _at in lines if what == "effect")
        # The job in flight when the pass was killed, or when the server crashed under it
        # (`crash_after`): its claim or completion may be lost with it.
        crash = ctx.get("crash")
        disrupted = killed_pid if crash is None else crash["pid"]
        moment = math.inf if crash is None else crash["at"]
        killed_starts = [
            int(n)
            for what, n, pid, at in lines
            if what == "start" and int(pid) == disrupted and float(at) < moment
        ]
        in_flight = killed_starts[-1] if killed_starts else None
        unclaimed = runs_the_crash_unclaimed(crash, starts=lines)
        rows = Counter(int(n) for n in get_user_model().objects.values_list("last_name", flat=True))
        jobs = {job.pk: job for job in Job.objects.all()}
        violations = []
        for n, kind, _extra, _priority, max_attempts in JOBS:
            job = jobs.get(ctx["ids"][n])
            if job is None:
                violations.append(f"job {n} lost")
                continue
            want = Job.Status.FAILED if kind == "faults.fail" else Job.Status.COMPLETED
            if job.status != want:
                violations.append(f"job {n} {kind} ended {job.status}, not {want}")
            # A run the crash took the claim of (an asynchronous commit) may run again, once.
            again = max(int(n == in_flight), unclaimed[ctx["ids"][n]])
            allowed = 1 + again
            if kind in EXTERNAL and effects[n] > allowed:
                violations.append(f"job {n} {kind}: external effect {effects[n]} times")
            if kind in DATABASE and rows[n] > 1:
                violations.append(f"job {n} {kind}: database effect {rows[n]} times")
            if kind == "faults.fail" and starts[n] > max_attempts + again:
                violations.append(f"job {n} ran {starts[n]} times, max_attempts {max_attempts}")
            if job.attempts > max_attempts:
                violations.append(f"job {n}: attempts {job.attempts} > max {max_attempts}")
            lost_run = again if crash is not None else 0  # its attempt may die with it
            if job.attempts < min(starts[n] - lost_run, max_attempts):
                violations.append(f"job {n}: {starts[n]} runs counted as {job.attempts} attempts")
            if job.attempts > starts[n] + 1:
                violations.append(f"job {n}: {job.attempts} attempts for {starts[n]} runs")
        if crash is not None:
            violations.extend(finished_before_the_crash_kept(crash, idempotent=set()))
        return violations

    def crash_snapshot(self, conn) -> dict[str, Any]:
        return crash_snapshot(conn)


def runs_the_crash_unclaimed(
    crash: dict[str, Any] | None, *, starts: list[list[str]]
) -> Counter[int]:
    """Job pk -> runs of the crashed pass with no attempt of its own in the history: their
    claim, committed asynchronously (`jobs_runner_step`'s claim is, unless it carries a
    completion that must be flushed), was lost with the server, so the pass ran them
    without holding them, and they run again (documented in `runner_step.job_runner_step`)."""
    if crash is None:
        return Counter()
    pid = str(crash["pid"])
    ran = Counter(int(n) for what, n, who, *_ in starts if what == "start" and who == pid)
    if not ran:
        return Counter()
    pks = dict(Job.objects.filter(payload__n__in=sorted(ran)).values_list("payload__n", "pk"))
    held = Counter(
        JobAttempt.objects.filter(job_id__in=pks.values(), worker__contains=f":{pid}:").values_list(
            "job_id", flat=True
        )
    )
    return Counter({pks[n]: ran[n] - held[pks[n]] for n in pks if ran[n] > held[pks[n]]})


def crash_snapshot(conn) -> dict[str, Any]:
    """Before the crash and after the restart (a connection of the harness's own): the jobs
    finished, and the rows `processing` without a lease."""
    finished = conn.execute(
        "SELECT id, kind FROM jobs_job WHERE status IN ('completed', 'failed')"
    ).fetchall()
    (unleased,) = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE status = 'processing' AND lease_expires_at IS NULL"
    ).fetchone()
    return {"finished": [[pk, kind] for pk, kind in finished], "unleased": unleased}


def finished_before_the_crash_kept(crash: dict[str, Any], *, idempotent: set[str]) -> list[str]:
    """A completion (or failure) committed before the crash, of a kind not declared
    idempotent, is still there after the restart; no row was `processing` without a lease."""
    before, after = crash["before"], crash["after"]
    kept = {pk for pk, _kind in after["finished"]}
    violations = [
        f"job #{pk} {kind}: finished before the crash, not after the restart"
        for pk, kind in before["finished"]
        if kind not in idempotent and pk not in kept
    ]
    for when in ("before", "after"):
        if crash[when]["unleased"]:
            violations.append(f"{crash[when]['unleased']} jobs processing without a lease {when}")
    return violations


def _read(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


JOBS_DRAIN = JobsDrain()
# The keeper's give-back at 0.2 s; the slow job ends the moment its answer is cut, and the
# keeper's next look comes 0.1 s later: the drain has taken the jobs it put back by then.
JOBS_DRAIN_SLOW_ENDS_AT_FAULT = JobsDrain(slow_ends_at_fault=True, hold=0.2)
# No give-back: completions wait in the batch for the drain's next statement.
JOBS_DRAIN_NO_GIVE_BACK = JobsDrain(hold=30.0)
