"""The runner's statement and the claim: `job_runner_step` (one round trip completes the jobs
run since the last one, marks a long one started, gives back unstarted claims and claims the
next batch) and `job_claim_batch` (tools' and tests' claim), with what a claim hands back
(`ClaimedJob`, `Step`). Apart from the single-job outcomes (jobs/outcomes.py) and the
operators' actions (jobs/operator_actions.py) because this is the SQL the drain's loop
sends, batch after batch, and changes with the migrations' `jobs_runner_step_v*`.

Ownership rule: a worker may write a `processing` row only while `locked_by` is its own
run id and the status is still `processing`; every such write is a guarded UPDATE, so a
completion that arrives after the reaper reclaimed the row changes nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction

from jobs.conf import get_config
from jobs.models import Job

if TYPE_CHECKING:
    from jobs.ledger import Room

Status = Job.Status


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
    beyond: int = 0,
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
    JOBS_HOLD_UNSTARTED_SECONDS (point 4; jobs/keeper.py). The claim ends with the first
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
    migration jobs/0024, `jobs_runner_step_v6`); None: no such limit. With `beyond` (and
    `room`), a kind nothing limits (no cap, no rate, not reserved, not in `slow_kinds`) may
    be claimed up to that many past the free thread slots, to wait unstarted as the one-slot
    drain's batch does (issue 37, point 4; migration jobs/0028, `jobs_runner_step_v7`); a
    row past them is not taken behind a row of a slow kind.

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
                max(0, beyond),
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


# The runner's one statement: the function of migration jobs/0028 (its plan is kept by the
# server session; the statement is there, with why each part is as it is). Nothing is kept
# in the client's session, so it works behind PgBouncer in transaction pooling.
_RUNNER_STEP_SQL = (
    "SELECT * FROM jobs_runner_step_v7(%s, %s::bigint[], %s::float8[], %s, %s, %s::bigint[], "
    "%s, %s, %s, %s, %s::text[], %s::timestamptz, %s::text[], %s::integer[], %s::text[], "
    "%s::integer, %s::integer, %s::integer, %s)"
)
