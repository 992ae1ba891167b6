"""Every write to the Job table but the reaper's (reaper.py), the producers' (enqueueing.py:
enqueue, enqueue_many; `enqueue` is importable from here as before) and pruning's
(pruning.py): claim, complete, fail, heartbeat, retry, cancel. The runner (runner.py), the
tasks, the commands and the admin call these.

Ownership rule: a worker may write a `processing` row only while `locked_by` is its own
run id and the status is still `processing`; every such write is a guarded UPDATE, so a
completion that arrives after the reaper reclaimed the row changes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.db.models import (
    DateTimeField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Coalesce, Greatest, Now

from jobs.conf import get_config
from jobs.enqueueing import enqueue, enqueue_many  # noqa: F401 - enqueue's home until issue 38
from jobs.exceptions import LeaseLost, PermanentJobError, Snooze
from jobs.models import Job
from project.backoff import retry_delay
from project.pg_text import without_nul

if TYPE_CHECKING:
    from jobs.ledger import Room

logger = logging.getLogger(__name__)

Status = Job.Status
LAST_ERROR_MAX_CHARS = 8000


# --- claim, complete, fail (the runner's operations) -----------------------------------------


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    kind: str
    payload: dict[str, Any]
    attempts: int  # including this attempt
    max_attempts: int


def new_worker_id() -> str:
    """A run id for `locked_by`: host, pid and a random part (a pid can be reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def job_claim_batch(*, worker: str, limit: int) -> list[ClaimedJob]:
    """Claim up to `limit` due jobs for `worker` in one short transaction and count the attempt.

    For tools and tests: it stamps `started_at` at the claim. The runner claims with
    `job_runner_step`, which leaves it to the handler's start (issue 22).
    """
    return _claim(worker=worker, limit=limit)[0]


@dataclass(frozen=True)
class Step:
    """What one `job_runner_step` statement did."""

    completed: frozenset[int]  # of `done`, the ids still this worker's, now completed
    released: int  # of `release`, how many were given back
    claimed: list[ClaimedJob]  # in claim order; the caller starts them one after another
    more_due: bool  # another due job is waiting beyond these (only looked for when asked)
    # The earliest `run_after` claimed, or the database's clock at the due scan when it
    # claimed nothing (None: no scan): what the claim floor keeps (jobs/claim_floor.py).
    seen_floor: datetime | None = None


def job_runner_step(
    *,
    worker: str,
    done: Sequence[tuple[int, float]] = (),
    mark: tuple[int, float] | None = None,
    release: Sequence[int] = (),
    claim: int = 0,
    want_more: bool = False,
    durable: bool = False,
    slow_kinds: Sequence[str] = (),
    floor: datetime | None = None,
    room: Room | None = None,
) -> Step:
    """The runner's one statement (migration jobs/0010, `jobs_runner_step`): complete the
    jobs in `done` (id, seconds since its handler started), mark `mark` (id, seconds since
    it started) as started, give back the unstarted claims in `release`, and claim up to
    `claim` due jobs (within JOBS_CLAIM_MAX_BYTES), as one statement: one round trip and one
    commit for a whole batch instead of two per job (issue 22, point 5). Every write is
    guarded by `locked_by = worker` and `processing`: a row the reaper took is left alone.

    A claimed row's `started_at` stays NULL: the runner says when each handler started (as
    seconds ago, so the stamp is on the database's clock) when it marks or completes it.
    Claims are handed out in a batch, but the runner starts them at once, one after
    another, and gives back what it has not started when a job runs longer than
    JOBS_HOLD_UNSTARTED_SECONDS (point 4; jobs/runner.py). The claim ends with the first
    job whose kind is in `slow_kinds` (kinds that recently ran longer than that): nothing is
    claimed that would wait behind it, to be given back and claimed again (issue 29, point
    3; migration jobs/0013, `jobs_runner_step_v2`). With `floor`, the due scan keeps only
    rows due at or after it, a bound checked on the claim index's entries, so the dead
    entries an old snapshot keeps below it cost no heap visit (issue 32, point 1; migration
    jobs/0014, `jobs_runner_step_v3`, and 0015's `jobs_runner_step_v4`, which returns the floor
    it saw as one float; the runner's floor is jobs/claim_floor.py). The due scan asks each
    lane (kind, priority) that may run for its rows, so a paused kind's backlog is never
    read (issue 36, point 1; migration jobs/0016, `jobs_runner_step_v5`). With `room` (the
    drain's free slots, jobs.ledger.Room) it takes no more of a kind than the process's
    slots can start: its own reserved slots, then the shared ones (issue 37, point 3;
    migration jobs/0024, `jobs_runner_step_v6`); None: no such limit.

    Runs in the caller's transaction: in autocommit mode (the runner) it commits alone;
    inside a transaction the caller's commit decides. `want_more` asks whether another due
    job waits beyond this claim (an `EXISTS`, so the runner asks once per drain).

    As a transaction of its own it commits asynchronously (`synchronous_commit` off for it
    alone; the WAL flush was half a job's wall time). A server crash (not a worker's) may
    then lose its last fraction of a second (PostgreSQL keeps it consistent: as if it had
    crashed that much earlier): a lost completion leaves the job `processing` until the
    reaper re-queues it, a lost claim leaves it queued with the attempt undone; either way
    it runs again, as after a worker crash at that moment. So the runner asks for that
    only when every completion in the statement is of a kind declared idempotent (issue
    29); `durable` keeps the flush: for every other completion (a crash must not re-run a
    job whose completion the worker saw), and for the keeper's hand-back, which must not be
    lost while its worker goes on as if it were done.
    """
    config = get_config()
    with connection.cursor() as cursor:
        cursor.execute(
            _RUNNER_STEP_SQL,
            [
                worker,
                [pk for pk, _ago in done],
                [float(ago) for _pk, ago in done],
                None if mark is None else mark[0],
                None if mark is None else float(mark[1]),
                list(release),
                claim,
                config.claim_max_bytes,
                float(config.lease_seconds),
                want_more,
                list(slow_kinds),
                floor,
                None if room is None else list(room.reserved),
                None if room is None else [max(0, n) for n in room.reserved.values()],
                None if room is None else room.async_kinds,
                None if room is None else max(0, room.thread_free),
                None if room is None else max(0, room.async_free),
                # its own transaction: commit without the flush
                connection.get_autocommit() and not durable,
            ],
        )
        rows = cursor.fetchall()
    completed, released = rows[0][0], rows[0][1]
    claimed = [
        ClaimedJob(id=pk, kind=kind, payload=_json(payload), attempts=attempts, max_attempts=m)
        for _c, _r, pk, kind, payload, attempts, m, _more, _seen in rows
        if pk is not None
    ]
    return Step(
        completed=frozenset(completed),
        released=released,
        claimed=claimed,
        more_due=bool(rows[0][7]),
        seen_floor=None if rows[0][8] is None else datetime.fromtimestamp(rows[0][8], UTC),
    )


def _claim(*, worker: str, limit: int) -> tuple[list[ClaimedJob], bool]:
    """The one claim statement (`_CLAIM_SQL`): `UPDATE … FROM (SELECT … FOR UPDATE SKIP
    LOCKED) RETURNING`, so concurrent workers never wait for or take each other's rows. Due,
    started_at and the lease are the database's clock."""
    with transaction.atomic(), connection.cursor() as cursor:
        config = get_config()
        # The capped kinds it may take, locked, and their free units (issue 37, point 2;
        # migration 0022): the claim is the next statement, so it sees every claim of them
        # committed before the locks were this transaction's.
        cursor.execute("SELECT kind, free FROM jobs_kind_free_v1('-infinity', clock_timestamp())")
        free = cursor.fetchall()
        cursor.execute(
            _CLAIM_SQL,
            [
                [kind for kind, _n in free],
                [n for _kind, n in free],
                limit,
                config.claim_max_bytes,
                config.lease_seconds,
                worker,
            ],
        )
        rows = cursor.fetchall()
    rows.sort(key=lambda row: (-row[5], row[6], row[0]))
    jobs = [
        ClaimedJob(id=pk, kind=kind, payload=_json(payload), attempts=attempts, max_attempts=m)
        for pk, kind, payload, attempts, m, _priority, _run_after, _more in rows
    ]
    return jobs, any(row[7] for row in rows)


def _json(value: Any) -> Any:
    # A raw cursor returns jsonb decoded by psycopg; keep a str fallback for other drivers.
    return json.loads(value) if isinstance(value, str) else value


# Served by the partial index jobs_job_claim_idx (status = 'queued'). `due` locks up to the
# count; `claim` keeps, in claim order, a capped kind's free units at most (`capped`, from
# jobs_kind_free_v1 under its locks; a capped kind not in it has none free), then the rows
# whose stored payloads (`pg_column_size`) add up to at most JOBS_CLAIM_MAX_BYTES, and always
# the first (a job larger than the bound still runs, alone). The rows left out stay queued;
# their locks end with this statement's transaction. (A window function cannot share a
# SELECT with FOR UPDATE, hence two steps.)
_CLAIM_SQL = f"""
WITH capped AS (
    SELECT c.kind, c.free FROM unnest(%s::text[], %s::integer[]) AS c(kind, free)
), due AS (
    SELECT id, kind, priority, run_after, pg_column_size(payload) AS size
    FROM {Job._meta.db_table}
    WHERE status = '{Status.QUEUED}' AND run_after <= clock_timestamp()
      AND attempts < max_attempts
      AND kind NOT IN (SELECT kind FROM jobs_pausedkind)  -- issue 20: paused kinds
      AND (kind IN (SELECT capped.kind FROM capped WHERE capped.free > 0)  -- issue 37: caps
           OR (kind NOT IN (SELECT kind FROM jobs_kindcap)
               AND kind NOT IN (SELECT kind FROM jobs_kindrate)))  -- issue 38: rates
    ORDER BY priority DESC, run_after, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), claim AS (
    SELECT id FROM (
        SELECT id,
            row_number() OVER w AS n,
            sum(size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes
        FROM (
            SELECT d.id, d.priority, d.run_after, d.size FROM (
                SELECT due.*, row_number() OVER (
                    PARTITION BY due.kind ORDER BY due.priority DESC, due.run_after, due.id
                ) AS nth
                FROM due
            ) AS d LEFT JOIN capped ON capped.kind = d.kind
            WHERE capped.kind IS NULL OR d.nth <= capped.free
        ) AS allowed WINDOW w AS (ORDER BY priority DESC, run_after, id)
    ) AS running
    WHERE n = 1 OR bytes <= %s
), claimed AS (
    UPDATE {Job._meta.db_table} AS j
    SET status = '{Status.PROCESSING}', attempts = j.attempts + 1,
        started_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + make_interval(secs => %s), locked_by = %s
    FROM claim WHERE j.id = claim.id
    RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.priority, j.run_after
), spent AS (
    -- Issue 38: a limited kind given its token (its bucket row locked) spends it on the job
    -- taken, as jobs_runner_step_v5 and v6 do (migration 0025).
    UPDATE jobs_kindrate AS b
    SET next_slot_at = jobs_rate_take_v1(b.next_slot_at, clock_timestamp(), b.interval_seconds),
        floor_at = t.first
    FROM (SELECT c.kind, min(c.run_after) AS first FROM claimed AS c GROUP BY c.kind) AS t
    WHERE b.kind = t.kind AND b.kind IN (SELECT capped.kind FROM capped)
      AND jobs_rate_take_v1(b.next_slot_at, clock_timestamp(), b.interval_seconds) IS NOT NULL
    RETURNING pg_notify('jobs_job_due', extract(epoch FROM b.next_slot_at)::text)
)
SELECT c.id, c.kind, c.payload, c.attempts, c.max_attempts, c.priority, c.run_after,
    EXISTS (
        SELECT 1 FROM {Job._meta.db_table} AS other
        WHERE other.status = '{Status.QUEUED}' AND other.run_after <= clock_timestamp()
          AND other.attempts < other.max_attempts AND other.id NOT IN (SELECT id FROM claim)
          AND other.kind NOT IN (SELECT kind FROM jobs_pausedkind)
    ) AS more_due
FROM claimed AS c CROSS JOIN (SELECT count(*) FROM spent) AS tokens
"""


# The runner's one statement: the function of migration jobs/0014 (its plan is kept by the
# server session; the statement is there, with why each part is as it is). Nothing is kept
# in the client's session, so it works behind PgBouncer in transaction pooling.
_RUNNER_STEP_SQL = (
    "SELECT * FROM jobs_runner_step_v6(%s, %s::bigint[], %s::float8[], %s, %s, %s::bigint[], "
    "%s, %s, %s, %s, %s::text[], %s::timestamptz, %s::text[], %s::integer[], %s::text[], "
    "%s::integer, %s::integer, %s)"
)


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


# --- operator actions (admin, commands) -------------------------------------------------------


def jobs_retry_now(*, jobs: QuerySet[Job]) -> int:
    """Queue the given queued/failed/cancelled jobs to run now; one UPDATE for any number.

    A failed job gets one more attempt (max_attempts raised to attempts + 1 if needed), so
    `attempts <= max_attempts` keeps holding, and its snoozes back (issue 38: one that
    failed for snoozing too often may snooze again); running or completed jobs are left
    alone.
    """
    fields = {
        "status": Status.QUEUED,
        "snoozes": 0,
        "run_after": Now(),
        "failed_at": None,
        "cancelled_at": None,
        "cancel_requested_at": None,  # an old cancel must not stop the next attempt
        "max_attempts": Greatest(F("max_attempts"), F("attempts") + 1),
    }
    retryable = jobs.filter(status__in=[Status.QUEUED, Status.FAILED, Status.CANCELLED])
    with transaction.atomic():
        count = retryable.filter(unique_key__isnull=True).update(**fields)
        count += _retry_keyed(retryable.filter(unique_key__isnull=False), fields)
    logger.info("jobs retried now: %s", count, extra={"action": "jobs_retry_now"})
    return count


def _retry_keyed(jobs: QuerySet[Job], fields: dict[str, Any]) -> int:
    """Re-queue keyed jobs, but none whose key another queued or processing job holds, and
    one per (kind, key): the newest (issue 38: the partial unique index would refuse the
    whole UPDATE). A queued one is counted as before, left as it is but for run_after."""
    live = Job.objects.filter(
        kind=OuterRef("kind"),
        unique_key=OuterRef("unique_key"),
        status__in=[Status.QUEUED, Status.PROCESSING],
    ).exclude(pk=OuterRef("pk"))
    newest = (
        jobs.exclude(Exists(live))
        .order_by("kind", "unique_key", "-pk")
        .distinct("kind", "unique_key")
        .values("pk")
    )
    return Job.objects.filter(pk__in=Subquery(newest)).update(**fields)


def jobs_cancel(*, jobs: QuerySet[Job]) -> int:
    """Cancel the given queued or failed jobs (one UPDATE), and ask the workers running the
    given `processing` ones to stop them; return how many of either.

    Cancelling a failed job is how an operator says "stop reporting it, it will not be
    retried": without it a permanent failure could only be retried (and fail again).
    `failed_at` and `last_error` stay as history. A running job is its worker's until its
    handler stops (issue 37, point 8): `cancel_requested_at` is set, the worker's keeper
    sees it within CANCEL_POLL_SECONDS (jobs/stopping.py) and asks the handler to stop (an
    async one's task is cancelled), and the job ends `cancelled`, its attempt recorded, once
    the handler has returned (jobs/stops.py). A completed one has nothing left to cancel.
    """
    from jobs.stops import jobs_request_cancel

    with transaction.atomic():
        count = jobs.filter(status__in=[Status.QUEUED, Status.FAILED]).update(
            status=Status.CANCELLED, cancelled_at=Now()
        )
        asked = jobs_request_cancel(jobs=jobs)
    logger.info(
        "jobs cancelled: %s; running jobs asked to stop: %s",
        count,
        asked,
        extra={"action": "jobs_cancel", "cancelled": count, "asked_to_stop": asked},
    )
    return count + asked


def jobs_prune_completed(*, older_than_days: float | None = None, chunk: int = 5000) -> int:
    """Delete completed jobs finished more than the retention ago, in short batches (the
    other states' retention and the record of what was pruned: jobs/pruning.py)."""
    from jobs.pruning import prune_state

    days = get_config().retention_days if older_than_days is None else older_than_days
    return prune_state(Status.COMPLETED, days=days, batch=chunk)
