"""Putting jobs in the queue: `enqueue` (one job) and `enqueue_many` (any number in one
statement), with unique keys, tags and metadata (issue 38, points 1, 5 and 7).

Every write happens in the caller's transaction and becomes visible at its commit; the
table's triggers wake the qcluster and write the lanes whoever inserts (migrations 0002,
0016). A unique key is decided by the database, never by a read before the insert: the
partial unique index `jobs_job_unique_key` (one queued or processing job per kind and key)
and, for the period after a completion the producer asked for (`unique_for`), the table
`jobs_jobuniquekey`, written by the completion's trigger. One job goes through the SQL
function `jobs_enqueue_unique` (migration 0020), which any producer's plain SQL may call
too; a bulk insert states the same rule for a set of rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from jobs import enqueue_checks as checks
from jobs.conf import get_config
from jobs.exceptions import EnqueueError
from jobs.models import Job

logger = logging.getLogger(__name__)

_ENQUEUE_UNIQUE_SQL = (
    "SELECT job_id, inserted FROM jobs_enqueue_unique("
    "%s, %s::jsonb, %s, %s::interval, %s, %s, %s::timestamptz, %s::text[], %s::jsonb)"
)


def enqueue(
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    run_after: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    unique_for: float | timedelta | None = None,
    tags: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
) -> Job:
    """Insert a queued job in the caller's transaction; it is visible when the caller commits.

    With `unique_key`, while a job of this kind with this key is queued or processing (or,
    after one enqueued with `unique_for` seconds completed, for that long), nothing is
    inserted and that job is returned (`job.was_inserted` is False; a job pruned since is
    returned as its id, kind and key, status completed). A second producer whose job meets
    another's uncommitted one waits for that transaction: its rollback lets this one insert.
    Without `run_after` the job is due at the database's `now()`, never at this host's clock.
    Raises EnqueueError (nothing sent) for arguments the queue refuses.
    """
    kind = checks.check_kind(kind)
    payload, payload_json = checks.check_payload(payload)
    unique_key = checks.check_unique_key(unique_key)
    unique_for = checks.check_unique_for(unique_for, has_key=unique_key is not None)
    tags = checks.check_tags(tags)
    meta = checks.check_meta(meta)
    priority = checks.check_priority(priority)
    max_attempts = checks.check_max_attempts(
        get_config().default_max_attempts if max_attempts is None else max_attempts
    )
    run_after = checks.check_run_after(run_after)
    if unique_key is None:
        fields: dict[str, Any] = {} if run_after is None else {"run_after": run_after}
        job = Job.objects.create(
            kind=kind,
            payload=payload,
            priority=priority,
            max_attempts=max_attempts,
            tags=tags,
            meta=meta,
            **fields,
        )
        job.was_inserted = True
    else:
        job = _enqueue_unique(
            kind,
            payload_json,
            unique_key,
            unique_for,
            priority,
            max_attempts,
            run_after,
            tags,
            checks.json_text("meta", meta) if meta is not None else None,
        )
    logger.debug(
        "job enqueued: #%s %s",
        job.pk,
        kind,
        extra={"action": "job_enqueued", "job_id": job.pk, "kind": kind},
    )
    return job


def _enqueue_unique(
    kind: str,
    payload_json: str,
    unique_key: str,
    unique_for: timedelta | None,
    priority: int,
    max_attempts: int,
    run_after: datetime | None,
    tags: list[str] | None,
    meta_json: str | None,
) -> Job:
    with connection.cursor() as cursor:
        cursor.execute(
            _ENQUEUE_UNIQUE_SQL,
            [
                kind,
                payload_json,
                unique_key,
                unique_for,
                priority,
                max_attempts,
                run_after,
                tags,
                meta_json,
            ],
        )
        job_id, inserted = cursor.fetchone()
    job = Job.objects.filter(pk=job_id).first()
    if job is None:  # its key outlived it: completed, then pruned
        job = Job(pk=job_id, kind=kind, unique_key=unique_key, status=Job.Status.COMPLETED)
        job._state.adding = False
    job.was_inserted = inserted
    return job


def enqueue_many(
    kind: str,
    payloads: Iterable[dict[str, Any]],
    *,
    run_after: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    unique_keys: Sequence[str | None] | None = None,
    unique_for: float | timedelta | None = None,
    tags: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
    unique_key: Any = None,
) -> int:
    """Insert a queued job of `kind` per payload in one statement, in the caller's
    transaction; return how many it inserted.

    The options are enqueue's, for every job, but the keys: `unique_keys[i]` (or None) is
    the i-th payload's. A payload whose key a live job holds, or a completed one keeps
    (`unique_for`), or an earlier payload of the same call took, is skipped, as `enqueue`
    would return the existing job. The wake-up and the lanes are the table's triggers', as
    for any insert (one NOTIFY per transaction). Raises EnqueueError, before any statement,
    for arguments the queue refuses (a payload that is not a JSON object among them).
    """
    if unique_key is not None:
        raise EnqueueError("enqueue_many takes unique_keys (one per payload), not unique_key")
    kind = checks.check_kind(kind)
    if isinstance(payloads, str | bytes | dict) or not isinstance(payloads, Iterable):
        raise EnqueueError(f"payloads must be a list of dicts, not {type(payloads).__name__}")
    payloads = list(payloads)
    for n, payload in enumerate(payloads):
        if not isinstance(payload, dict):
            raise EnqueueError(f"payloads[{n}] must be a dict, not {type(payload).__name__}")
    keys = _check_keys(unique_keys, len(payloads))
    unique_for = checks.check_unique_for(unique_for, has_key=keys is not None)
    tags = checks.check_tags(tags)
    meta = checks.check_meta(meta)
    priority = checks.check_priority(priority)
    max_attempts = checks.check_max_attempts(
        get_config().default_max_attempts if max_attempts is None else max_attempts
    )
    run_after = checks.check_run_after(run_after)
    try:
        payloads_json = checks.json_text("payloads", payloads)
    except EnqueueError:
        for n, payload in enumerate(payloads):  # name the first bad one
            checks.json_text(f"payloads[{n}]", payload)
        raise
    if not payloads:
        return 0
    from jobs.bulk_sql import insert_many

    inserted = insert_many(
        kind=kind,
        payloads_json=payloads_json,
        keys=keys,
        unique_for=unique_for,
        priority=priority,
        max_attempts=max_attempts,
        run_after=run_after,
        tags=tags,
        meta_json=checks.json_text("meta", meta) if meta is not None else None,
    )
    logger.info(
        "jobs enqueued in bulk: %s of %s %s",
        inserted,
        len(payloads),
        kind,
        extra={"action": "jobs_enqueued_many", "kind": kind, "count": inserted},
    )
    return inserted


def _check_keys(unique_keys: Any, count: int) -> list[str | None] | None:
    if unique_keys is None:
        return None
    if isinstance(unique_keys, str | bytes | dict) or not isinstance(unique_keys, Iterable):
        raise EnqueueError("unique_keys must be a list of strings (or None), one per payload")
    keys = list(unique_keys)
    if len(keys) != count:
        raise EnqueueError(f"unique_keys has {len(keys)} keys for {count} payloads")
    return [checks.check_unique_key(key, f"unique_keys[{n}]") for n, key in enumerate(keys)]
