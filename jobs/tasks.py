"""The functions the qcluster calls (paths in ops/schedules.py and the wake-up task)."""

from __future__ import annotations

import logging

from jobs import cluster_stop, lanes, reaper
from jobs.conf import get_config
from jobs.pruning import jobs_prune
from jobs.runner import run_pending
from jobs.wake_tasks import request_wake

logger = logging.getLogger(__name__)


def run_due_jobs() -> dict:
    """Drain due jobs: called on commit of an enqueue (wake-up) and every minute (retries,
    anything a lost wake-up missed). Bounded by JOBS_DRAIN_SECONDS, checked before every
    job, so it ends well inside the django-q2 task timeout (overrunning by at most the job
    running); unstarted claims are released, and the next wake-up or minute picks them up.
    A drain that sees more due jobs than it is starting asks for one more wake task, so an
    idle worker starts them (never more than workers + 1 outstanding). Out of jobs, it
    lingers JOBS_LINGER_SECONDS for the next one (a read every JOBS_LINGER_POLL_SECONDS),
    so a job enqueued meanwhile starts within that poll (issue 29, point 5)."""
    config = get_config()
    summary = run_pending(
        max_seconds=config.drain_seconds,
        stop=cluster_stop.stop_event(),  # the qcluster's SIGTERM (issue 37, point 9)
        wake_others=lambda: request_wake(workers=config.cluster_workers),
        linger=config.linger_seconds,
    )
    if summary.retire:
        # A handler did not stop when asked (issue 37, point 6): django-q2 replaces this
        # worker process once this task's result is back.
        from jobs.retire import retire_qcluster_worker

        retire_qcluster_worker(summary.hung)
    result = summary.as_dict()
    result.pop("errors")  # logged already; the django-q2 result row stays small
    return result


def reap_stale_jobs() -> int:
    """Reclaim rows whose worker stopped heartbeating; return how many. First, the minute's
    other safety net: the lane of any queued row written with the triggers off, without
    which the claim would never ask for it (jobs/lanes.py)."""
    missing = lanes.job_lanes_repair()
    if missing:
        logger.warning(
            "wrote %s missing job lanes: queued rows were written with the triggers off",
            missing,
            extra={"action": "jobs_lanes_repaired", "lanes": missing},
        )
    return len(reaper.jobs_reap_stale())


def prune_completed_jobs() -> int:
    """Delete completed, failed and cancelled jobs past their retention (JOBS_RETENTION_DAYS,
    JOBS_FAILED_RETENTION_DAYS, JOBS_CANCELLED_RETENTION_DAYS) and expired unique keys;
    return how many rows. The name is the schedule's since before issue 38 (ops/schedules.py:
    a rename would leave the stored schedule pointing nowhere). Also the JobStop rows older
    than a day (issue 37: only the last hour's are read)."""
    from jobs.stops import jobs_prune_stops

    jobs_prune_stops()
    return jobs_prune().total
