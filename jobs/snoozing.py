"""Recording a snooze (issue 38, point 2): a handler raised `jobs.Snooze(seconds)`.

A snooze is not a failure: the job goes back to `queued`, due `seconds` from now on the
database's clock, and the attempt the claim counted is given back (`attempts - 1`), so
`max_attempts` keeps counting real failures. `snoozes` counts instead, bounded by
JOBS_MAX_SNOOZES: the snooze past it fails the job, its reason in `last_error`. The
attempt history (the statement trigger of migration 0023) closes the attempt as
`snoozed`, with `last_error`'s line saying for how long.

One guarded UPDATE in a transaction of its own, after the handler's transaction was rolled
back, as for a failure (I3): `locked_by`, `processing` and the attempt number must still be
this worker's claim, or nothing is written ('lost': the reaper's state stands).
"""

from __future__ import annotations

from django.db import connection, transaction

from jobs.conf import get_config
from jobs.exceptions import Snooze
from jobs.models import Job

Status = Job.Status

_SNOOZE_SQL = f"""
WITH decided AS (
    SELECT id, snoozes >= %(max)s AS spent FROM {Job._meta.db_table}
    WHERE id = %(id)s AND locked_by = %(worker)s AND status = '{Status.PROCESSING}'
      AND attempts = %(attempts)s
    FOR UPDATE
)
UPDATE {Job._meta.db_table} AS j
SET status = CASE WHEN d.spent THEN '{Status.FAILED}' ELSE '{Status.QUEUED}' END,
    attempts = CASE WHEN d.spent THEN j.attempts ELSE j.attempts - 1 END,
    snoozes = CASE WHEN d.spent THEN j.snoozes ELSE j.snoozes + 1 END,
    run_after = CASE WHEN d.spent THEN j.run_after
        ELSE now() + make_interval(secs => %(seconds)s) END,
    failed_at = CASE WHEN d.spent THEN now() END,
    last_error = CASE WHEN d.spent THEN %(spent_error)s
        ELSE format(%(snoozed_error)s, j.snoozes + 1) END,
    locked_by = '', lease_expires_at = NULL,
    started_at = coalesce(j.started_at, now() - make_interval(secs => %(ago)s))
FROM decided AS d
WHERE j.id = d.id
RETURNING j.status
"""


def spent_reason(limit: int) -> str:
    """Why a job that snoozed once more than allowed fails (its error, the drain's line)."""
    return f"snoozed {limit} times, the most JOBS_MAX_SNOOZES={limit} allows; the job fails"


def job_record_snooze(*, job, worker: str, snooze: Snooze, started_ago: float = 0.0) -> str:
    """Record `snooze` for the claimed `job`; return 'snoozed', 'failed' (its snoozes were
    spent) or 'lost' (the row is no longer this worker's claim)."""
    limit = get_config().max_snoozes
    seconds = snooze.seconds
    params = {
        "max": limit,
        "id": job.id,
        "worker": worker,
        "attempts": job.attempts,
        "seconds": seconds,
        "ago": max(started_ago, 0.0),
        # SQL format()'s %s: the snooze's number, from the row
        "snoozed_error": (
            f"jobs.Snooze: snoozed for {seconds:g} s (snooze %s of at most {limit}; "
            "no attempt spent)"
        ),
        "spent_error": f"jobs.Snooze: {spent_reason(limit)} (asked for {seconds:g} s more)",
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SNOOZE_SQL, params)
        row = cursor.fetchone()
    if row is None:
        return "lost"
    return "failed" if row[0] == Status.FAILED else "snoozed"
