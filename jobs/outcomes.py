"""One job's outcome, written alone: its completion inside its handler's transaction
(`job_complete`), a failed attempt (`job_record_failure`, its backoff `job_retry_delay`), a
give-back of unstarted claims (`job_release`), the keeper's marks and lease renewals
(`jobs_mark_started`, `job_heartbeat`), and the error text a failure records
(`format_error`). Apart from the runner's statement (jobs/runner_step.py), which carries a
batch's completions, because these are the writes of one job that the slots, the completer
and the keeper make around it.

Ownership rule: a worker may write a `processing` row only while `locked_by` is its own
run id and the status is still `processing`; every such write is a guarded UPDATE, so a
completion that arrives after the reaper reclaimed the row changes nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F
from django.db.models.functions import Coalesce, Now

from jobs.conf import get_config
from jobs.exceptions import LeaseLost, PermanentJobError, Snooze
from jobs.models import Job
from jobs.runner_step import ClaimedJob, job_runner_step
from project.backoff import retry_delay
from project.pg_text import without_nul

Status = Job.Status
LAST_ERROR_MAX_CHARS = 8000


def job_complete(*, job: ClaimedJob, worker: str, started_ago: float = 0.0) -> None:
    """Mark the job completed, inside the handler's transaction, if `worker` still owns it;
    its handler started `started_ago` seconds ago (stamped on the database's clock).

    Raises LeaseLost otherwise, which rolls the handler's work back with it: the reaper has
    already put the row back in the queue (or failed it), and that state wins. Plain SQL
    because it runs once per job: the ORM's query building was half the per-job cost
    (bench/jobs.py).
    """
    with connection.cursor() as cursor:
        cursor.execute(_COMPLETE_SQL, [max(started_ago, 0.0), job.id, worker, job.attempts])
        updated = cursor.rowcount
    if updated != 1:
        raise LeaseLost(f"job #{job.id} is no longer owned by {worker} (reaped?)")


_COMPLETE_SQL = f"""
UPDATE {Job._meta.db_table}
SET status = '{Status.COMPLETED}', completed_at = clock_timestamp(), locked_by = '',
    lease_expires_at = NULL,
    started_at = coalesce(started_at, clock_timestamp() - make_interval(secs => %s))
WHERE id = %s AND locked_by = %s AND status = '{Status.PROCESSING}' AND attempts = %s
"""  # table and status values are constants; the values are parameters
# `attempts`: a drain with slots may claim again a row the reaper took from one of its own
# slots (the same `locked_by`); only the attempt number tells the two attempts apart.


def job_record_failure(
    *, job: ClaimedJob, worker: str, exc: BaseException, started_ago: float = 0.0
) -> str:
    """Record a failed attempt in its own transaction; return 'retried', 'failed' or 'lost'.

    The caller has already rolled the handler's transaction back (COR-17): this must never
    run on an aborted transaction. A permanent error (PermanentJobError, unknown kind,
    rejected payload) or the last attempt fails the row; anything else re-queues it after
    the backoff. An interrupt (KeyboardInterrupt, SystemExit) is the worker stopping, not
    the job failing: it re-queues without delay (the attempt still counts). Any other
    BaseException (CancelledError, GeneratorExit, a library's own) is a failure like any
    other and backs off: a handler that always raises one must not spin. A `jobs.Snooze`
    is no failure: 'snoozed' (jobs/snoozing.py), or 'failed' past JOBS_MAX_SNOOZES.
    """
    if isinstance(exc, Snooze):
        from jobs.snoozing import job_record_snooze

        return job_record_snooze(job=job, worker=worker, snooze=exc, started_ago=started_ago)
    error = format_error(exc)
    fields: dict[str, Any] = {
        "locked_by": "",
        "lease_expires_at": None,
        "last_error": error,
        # the handler's start, if the runner had not written it yet (a batch claim leaves
        # it NULL until then), on the database's clock
        "started_at": Coalesce(F("started_at"), _db_now_plus(-max(started_ago, 0.0))),
    }
    if isinstance(exc, PermanentJobError) or job.attempts >= job.max_attempts:
        outcome = "failed"
        fields.update(status=Status.FAILED, failed_at=Now())
    else:
        outcome = "retried"
        stopping = isinstance(exc, KeyboardInterrupt | SystemExit)
        delay = 0.0 if stopping else job_retry_delay(job.attempts)
        fields.update(status=Status.QUEUED, run_after=_db_now_plus(delay))
    with transaction.atomic():
        updated = Job.objects.filter(
            pk=job.id, locked_by=worker, status=Status.PROCESSING, attempts=job.attempts
        ).update(**fields)
    return outcome if updated == 1 else "lost"


def job_retry_delay(attempts: int) -> float:
    """Seconds before a job's next try after `attempts` failed ones (JOBS_BACKOFF_*)."""
    config = get_config()
    return retry_delay(
        attempts,
        base=config.backoff_base_seconds,
        cap=config.backoff_cap_seconds,
        jitter=config.backoff_jitter,
    )


def job_release(*, worker: str, job_ids: list[int]) -> int:
    """Give back claimed jobs this worker never started (it is stopping, or its drain ran out
    of time): their attempt is undone, so neither a graceful shutdown nor a drain deadline
    burns attempts of a whole batch. The runner's own statement does it (`release`); this
    is that, alone and flushed, for claims taken with `job_claim_batch`."""
    if not job_ids:
        return 0
    return job_runner_step(worker=worker, release=job_ids, durable=True).released


def jobs_mark_started(*, worker: str, started: Sequence[tuple[int, float]]) -> set[int]:
    """Mark running jobs started (their start and their attempt show while they run):
    `started` holds (id, seconds since its handler started), stamped on the database's
    clock. One statement for all of them (a job a statement cost four round trips each, one
    after another: 5,000 async jobs of a second were 20,000 round trips of the keeper's and
    as many UPDATEs with their statement triggers; docs/performance.md), committed without
    the flush, as a mark always was. Returns the ids marked.

    A row that is locked is skipped, not waited for: the keeper's mark never waits for a
    row lock. Waiting, it would queue on the row (behind the reaper taking it, say) and hold
    the row's tuple lock meanwhile, so another worker's claim (FOR UPDATE SKIP LOCKED) would
    skip the row the reaper had just given back, and the drain that lost it could take it
    again. A locked row is being taken by the reaper or completed by its handler: the mark
    is not needed then. A row no longer this worker's, or already marked, is left alone."""
    if not started:
        return set()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(
            _MARK_STARTED_SQL,
            [[pk for pk, _ago in started], [float(ago) for _pk, ago in started], worker],
        )
        return {pk for (pk,) in cursor.fetchall()}


_MARK_STARTED_SQL = f"""
/* jobs_mark_started */
WITH mine AS (
    SELECT j.id, m.ago
    FROM {Job._meta.db_table} AS j
    JOIN unnest(%s::bigint[], %s::float8[]) AS m(id, ago) ON m.id = j.id
    WHERE j.locked_by = %s AND (j.status = '{Status.PROCESSING}') IS TRUE
      AND j.started_at IS NULL
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {Job._meta.db_table} AS j
SET started_at = clock_timestamp() - make_interval(secs => greatest(mine.ago, 0))
FROM mine WHERE j.id = mine.id
RETURNING j.id
"""


def job_heartbeat(*, worker: str, job_ids: Sequence[int] | None = None) -> int:
    """Renew the lease of every row `worker` holds (or only of `job_ids` among them), on the
    database's clock; return how many.

    The runner names the rows it knows it holds: a row claimed by a statement whose answer
    was lost is `worker`'s too, but the runner will never start it, so its lease must run
    out for the reaper to give it back (issue 29, point 2)."""
    rows = Job.objects.filter(locked_by=worker, status=Status.PROCESSING)
    if job_ids is not None:
        rows = rows.filter(pk__in=list(job_ids))
    return rows.update(
        heartbeat_at=Now(), lease_expires_at=_db_now_plus(get_config().lease_seconds)
    )


def _db_now_plus(seconds: float) -> ExpressionWrapper:
    """`now() + seconds` evaluated by the database (a host's clock may be minutes off)."""
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def exception_message(exc: BaseException) -> str:
    """`str(exc)` that never raises and holds no NUL character.

    Recording a failure must not fail in turn: an error quoting hostile input may carry a
    NUL, which PostgreSQL text refuses (the UPDATE raised and crashed the drain), and an
    exception's own `__str__` may raise. Shown as `\\x00` and a placeholder instead.
    """
    try:
        text = str(exc)
    except Exception as failure:  # noqa: BLE001 - the placeholder names what went wrong
        text = f"<str() failed: {type(failure).__name__}>"
    return without_nul(text)


def format_error(exc: BaseException) -> str:
    """`module.Type: message` then the traceback's tail, so the admin shows what and where."""
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    head = f"{name}: {exception_message(exc)}".strip()
    tb = without_nul("".join(traceback.format_exception(exc)))
    text = f"{head}\n\n{tb}"
    if len(text) > LAST_ERROR_MAX_CHARS:
        keep = LAST_ERROR_MAX_CHARS - len(head) - 40
        text = f"{head[:2000]}\n\n[... traceback trimmed ...]\n{tb[-max(keep, 1000) :]}"
    return text
