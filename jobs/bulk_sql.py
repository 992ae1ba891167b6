"""The statements of `enqueue_many` (issue 38, point 7): every job of a call in one INSERT.

The payloads travel as one JSON array (one parameter, parsed once by the server:
`jsonb_array_elements`), their keys as one text[] beside it (`ROWS FROM` pairs them by
position). Without keys the INSERT has no ON CONFLICT, so a plain backfill pays nothing for
the rule. With keys it states `jobs_enqueue_unique`'s rule for the set: skip a key a
completed job keeps (`jobs_jobuniquekey`), and `ON CONFLICT … DO NOTHING` on the partial
unique index for a live job's (or an earlier row's of the same statement); a key held by
another producer's uncommitted job makes the statement wait for that transaction and insert
if it rolls back. A completion committed during that wait is seen only by a later
statement: the second one takes back the rows whose key it now keeps (in the caller's
transaction, so nobody saw them).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection

_COLUMNS = """
    kind, payload, status, priority, attempts, max_attempts, run_after, locked_by, last_error,
    unique_key, unique_for, tags, meta
"""

_INSERT_PLAIN = f"""
WITH inserted AS (
    INSERT INTO jobs_job ({_COLUMNS})
    SELECT %(kind)s, p.payload, 'queued', %(priority)s, 0, %(max_attempts)s,
           coalesce(%(run_after)s::timestamptz, now()), '', '', NULL, NULL,
           %(tags)s::text[], %(meta)s::jsonb
    FROM jsonb_array_elements(%(payloads)s::jsonb) AS p(payload)
    RETURNING 1
)
SELECT count(*), '{{}}'::bigint[] FROM inserted
"""

_INSERT_KEYED = f"""
WITH inserted AS (
    INSERT INTO jobs_job AS j ({_COLUMNS})
    SELECT %(kind)s, p.payload, 'queued', %(priority)s, 0, %(max_attempts)s,
           coalesce(%(run_after)s::timestamptz, now()), '', '', p.key,
           CASE WHEN p.key IS NOT NULL THEN %(unique_for)s::interval END,
           %(tags)s::text[], %(meta)s::jsonb
    FROM ROWS FROM (jsonb_array_elements(%(payloads)s::jsonb), unnest(%(keys)s::text[]))
         AS p(payload, key)
    WHERE p.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobs_jobuniquekey AS k
        WHERE k.kind = %(kind)s AND k.unique_key = p.key AND k.expires_at > clock_timestamp())
    ON CONFLICT (kind, unique_key)
        WHERE unique_key IS NOT NULL AND status IN ('queued', 'processing')
    DO NOTHING
    RETURNING j.id, j.unique_key
)
SELECT count(*), coalesce(array_agg(id) FILTER (WHERE unique_key IS NOT NULL), '{{}}')
FROM inserted
"""

# A completion committed while the INSERT waited for its job's row: its key is kept.
_TAKE_BACK = """
DELETE FROM jobs_job AS j USING jobs_jobuniquekey AS k
WHERE j.id = ANY(%s::bigint[]) AND k.kind = j.kind AND k.unique_key = j.unique_key
  AND k.expires_at > clock_timestamp() AND k.job_id <> j.id
"""


def insert_many(
    *,
    kind: str,
    payloads_json: str,
    keys: list[str | None] | None,
    unique_for: timedelta | None,
    priority: int,
    max_attempts: int,
    run_after: datetime | None,
    tags: list[str] | None,
    meta_json: str | None,
) -> int:
    """Insert the checked jobs (jobs.enqueueing.enqueue_many); return how many it inserted."""
    params = {
        "kind": kind,
        "payloads": payloads_json,
        "keys": keys,
        "unique_for": unique_for,
        "priority": priority,
        "max_attempts": max_attempts,
        "run_after": run_after,
        "tags": tags,
        "meta": meta_json,
    }
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_PLAIN if keys is None else _INSERT_KEYED, params)
        inserted, keyed_ids = cursor.fetchone()
        if keyed_ids:
            cursor.execute(_TAKE_BACK, [keyed_ids])
            inserted -= cursor.rowcount
    return inserted
