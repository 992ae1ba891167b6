"""The writes and reads of stopped jobs (issue 37, points 6, 8, 9 and 10): a job whose handler
timed out, was cancelled while it ran, or was asked to stop because its process stops.

Ownership as in runner_step.py: every write to a `processing` row is guarded by `locked_by`,
the status and the attempt number, so a late outcome of an older attempt (the reaper took
the row, another drain claimed it again) changes nothing. Each stopped attempt of a timeout
or a cancel leaves a `JobStop` row in the same transaction, which the health page,
worker_status and /metrics count over the last hour.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, QuerySet
from django.db.models.functions import Coalesce, Now

from jobs.exceptions import JobCancelled, JobTimedOut, WorkerStopping
from jobs.models import Job, JobStop
from jobs.outcomes import format_error, job_record_failure
from jobs.runner_step import ClaimedJob

logger = logging.getLogger(__name__)

Status = Job.Status

# Why the runner asked a handler to stop (Slot.stop_reason, JobContext.stop_reason).
STOP_TIMEOUT, STOP_CANCEL, STOP_SHUTDOWN = "timeout", "cancel", "shutdown"
# Another async handler blocked the event loop this one runs on past the grace: its process
# retires with it, and this job is re-run (it did not time out, nor fail).
STOP_LOOP_BLOCKED = "loop_blocked"


def stop_error(reason: str, *, seconds: float | None) -> BaseException:
    """The exception recorded for a stop: its `module.Type: message` heads `last_error` and
    the attempt's error."""
    if reason == STOP_TIMEOUT:
        return JobTimedOut(f"timed out after {seconds:g} s")
    if reason == STOP_CANCEL:
        return JobCancelled("cancelled while running, by an operator")
    if reason == STOP_LOOP_BLOCKED:
        return WorkerStopping(
            "stopped: the event loop was blocked (by another handler's synchronous code, on "
            "the loop this job ran on), and its process retired"
        )
    return WorkerStopping("stopped: its worker process was shutting down (SIGTERM)")


def job_record_stopped(
    *,
    job: ClaimedJob,
    worker: str,
    reason: str,
    seconds: float | None = None,
    started_ago: float = 0.0,
    cause: BaseException | None = None,
) -> str:
    """Record the end of an attempt whose handler was asked to stop and has now returned (or
    raised): 'cancelled', or as a failure 'retried' / 'failed' ("timed out after N s"), or,
    its process stopping, 'retried' at once with the attempt given back; 'lost' when the
    row is no longer this attempt's. A cancel requested meanwhile wins over the others."""
    with transaction.atomic():
        if reason == STOP_CANCEL or _cancel_requested(job, worker):
            return _record_cancelled(job=job, worker=worker, started_ago=started_ago)
        if reason in (STOP_SHUTDOWN, STOP_LOOP_BLOCKED):
            return _given_back(job=job, worker=worker, reason=reason)
        exc = stop_error(reason, seconds=seconds)
        exc.__cause__ = cause
        outcome = job_record_failure(job=job, worker=worker, exc=exc, started_ago=started_ago)
        if outcome != "lost" and reason == STOP_TIMEOUT:
            _stopped(job, JobStop.Reason.TIMEOUT)
    return outcome


def _cancel_requested(job: ClaimedJob, worker: str) -> bool:
    return Job.objects.filter(
        pk=job.id,
        locked_by=worker,
        status=Status.PROCESSING,
        attempts=job.attempts,
        cancel_requested_at__isnull=False,
    ).exists()


def _record_cancelled(*, job: ClaimedJob, worker: str, started_ago: float) -> str:
    error = format_error(stop_error(STOP_CANCEL, seconds=None)).split("\n", 1)[0]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Job._meta.db_table}
            SET status = '{Status.CANCELLED}', cancelled_at = clock_timestamp(), locked_by = '',
                lease_expires_at = NULL, last_error = %s,
                started_at = coalesce(started_at, clock_timestamp() - make_interval(secs => %s))
            WHERE id = %s AND locked_by = %s AND status = '{Status.PROCESSING}' AND attempts = %s
            """,
            [
                f"{error} (attempt {job.attempts}; requested at {_requested_at(job.id)})",
                max(started_ago, 0.0),
                job.id,
                worker,
                job.attempts,
            ],
        )
        updated = cursor.rowcount
    if updated != 1:
        return "lost"
    _stopped(job, JobStop.Reason.CANCEL)
    return "cancelled"


def _given_back(*, job: ClaimedJob, worker: str, reason: str) -> str:
    """Its process stopped it (SIGTERM, or another handler blocked its event loop): queued
    again at once with its attempt given back, as an unstarted claim's is: the job did not
    fail, and a deploy must not fail a job on its last attempt. Its history row says
    `released`, with the reason. 'retried', or 'lost' when the row is no longer this
    attempt's."""
    error = format_error(stop_error(reason, seconds=None)).split("\n", 1)[0]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Job._meta.db_table}
            SET status = '{Status.QUEUED}', attempts = attempts - 1,
                run_after = clock_timestamp(), locked_by = '', lease_expires_at = NULL,
                last_error = %s
            WHERE id = %s AND locked_by = %s AND status = '{Status.PROCESSING}' AND attempts = %s
            """,
            [f"{error} (attempt {job.attempts}, given back)", job.id, worker, job.attempts],
        )
        return "retried" if cursor.rowcount == 1 else "lost"


def _requested_at(job_id: int) -> str:
    at = Job.objects.filter(pk=job_id).values_list("cancel_requested_at", flat=True).first()
    return f"{at:%Y-%m-%d %H:%M:%S} UTC" if at else "?"


def job_give_up(
    *, job: ClaimedJob, worker: str, reason: str, seconds: float | None, grace: float
) -> bool:
    """A handler asked to stop has not returned within `grace`: its process retires (exits, to
    be replaced) and leaves the job `processing` (a thread cannot be killed: re-queued while
    its handler may still run, its effect could happen twice, I21), with the reason in
    `last_error` and a lease that runs out soon after the process is gone, so the reaper
    re-queues it with that reason in its attempt history (jobs/reaper.py). True when the row
    was still this attempt's."""
    head = format_error(stop_error(reason, seconds=seconds)).split("\n", 1)[0]
    error = given_up_error(head, attempt=job.attempts, grace=grace, worker=worker)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Job._meta.db_table}
            SET last_error = %s,
                lease_expires_at = clock_timestamp() + make_interval(secs => %s)
            WHERE id = %s AND locked_by = %s AND status = '{Status.PROCESSING}' AND attempts = %s
            """,
            [error, give_up_lease_seconds(grace), job.id, worker, job.attempts],
        )
        kept = cursor.rowcount == 1
        if kept and reason in (STOP_TIMEOUT, STOP_CANCEL):
            _stopped(job, reason)
    return kept


def give_up_lease_seconds(grace: float) -> float:
    """The lease a given-up job keeps: longer than its process takes to exit (the watchdog
    of jobs/retire.py ends it after half of this at most)."""
    return max(2.0 * grace, 2.0)


GIVEN_UP_MARK = "the handler did not return within JOBS_STOP_GRACE_SECONDS"


def given_up_error(head: str, *, attempt: int, grace: float, worker: str) -> str:
    return (
        f"{head} (attempt {attempt}: {GIVEN_UP_MARK}={grace:g} s of being asked to stop; its "
        f"process {worker} retired to be replaced, and the reaper takes the job back once "
        "its lease has run out)"
    )


def given_up_reason(last_error: str, attempt: int) -> str | None:
    """The reason a retired process left in a row of attempt `attempt`, if it left one."""
    head = (last_error or "").split("\n", 1)[0]
    return head if f"(attempt {attempt}: {GIVEN_UP_MARK}" in head else None


def _stopped(job: ClaimedJob, reason: str) -> None:
    JobStop.objects.create(job_id=job.id, attempt=job.attempts, kind=job.kind, reason=reason)


def jobs_cancel_requested(*, worker: str, running: Sequence[tuple[int, int]]) -> set[int]:
    """Of the running (id, attempt) pairs, those an operator asked to cancel: the keeper's
    poll (jobs/stopping.py), one primary-key lookup per running job."""
    if not running:
        return set()
    attempts = dict(running)
    rows = Job.objects.filter(
        pk__in=list(attempts),
        locked_by=worker,
        status=Status.PROCESSING,
        cancel_requested_at__isnull=False,
    ).values_list("pk", "attempts")
    return {pk for pk, attempt in rows if attempts.get(pk) == attempt}


def jobs_request_cancel(*, jobs: QuerySet[Job]) -> int:
    """Ask the workers holding the given `processing` jobs to stop them (the first request's
    time is kept); return how many. Their jobs end `cancelled` once their handlers stop."""
    return jobs.filter(status=Status.PROCESSING).update(
        cancel_requested_at=Coalesce("cancel_requested_at", Now())
    )


def job_stop_counts(*, now: datetime, window: timedelta = timedelta(hours=1)) -> dict:
    """{kind: {"timeout": n, "cancel": n}} over the window (default: the last hour), from the
    `at` index of the few JobStop rows."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"timeout": 0, "cancel": 0})
    rows = (
        JobStop.objects.filter(at__gte=now - window)
        .values_list("kind", "reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    for kind, reason, n in rows:
        counts[kind][reason] = n
    return dict(sorted(counts.items()))


def jobs_prune_stops(*, older_than: timedelta = timedelta(days=1)) -> int:
    """Delete JobStop rows older than a day (only the last hour is read)."""
    from django.utils import timezone

    deleted, _ = JobStop.objects.filter(at__lt=timezone.now() - older_than).delete()
    return deleted
