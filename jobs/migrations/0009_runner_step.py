"""The runner's one statement per job as a function, and a cheaper count trigger (issue 22,
point 5: throughput).

`jobs_finish_and_claim` completes the job the runner just ran and claims the next one in one
statement (jobs/services.py calls it). A PL/pgSQL function because its plan is kept by the
server session: planning the statement sent as text took about 0.3 ms of server time per
job, as much as running it. Nothing is kept in the client's session, so it works behind
PgBouncer in transaction pooling (a prepared statement would not).

Run by the runner as a transaction of its own, it commits without waiting for the WAL
flush (`synchronous_commit` off for that transaction only): on this VM the flush was half
of a job's wall time. Why nothing durable is at stake: jobs/services.py, job_finish_and_claim.

The count trigger: 0007's version built a JSON document of the deltas and handed it to a SQL function that
decoded it again: about a quarter of a millisecond of server time on every UPDATE of
jobs_job, the runner's per-job statement included (bench/jobs.py). Here the transition
tables are joined once, each changed row gives its -1 and its +1, and only the (kind,
status) pairs whose count changes are written, in a fixed order (two backends that share a
shard take the row locks in the same order). A claim that completes the previous job in the
same statement nets `processing` to zero and writes two rows, not four.
"""

from django.db import migrations

FINISH_AND_CLAIM = """
CREATE FUNCTION jobs_finish_and_claim(
    p_done bigint, p_worker text, p_claim boolean, p_lease_seconds float8, p_more boolean,
    p_async_commit boolean
) RETURNS TABLE (
    completed bigint, id bigint, kind text, payload jsonb, attempts integer,
    max_attempts integer, more_due boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_async_commit THEN
        -- Only when this statement is its own transaction (the runner's caller says so):
        -- see jobs/services.py, job_finish_and_claim, for why nothing durable is at stake.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Both UPDATEs are on jobs_job in one statement, so its statement triggers (counts,
    -- wake-up) fire once, over both rows. The due scan is served by jobs_job_claim_idx;
    -- `IS TRUE` keeps the completion on the primary key (through jobs_job_status_done_idx
    -- it walked every dead 'processing' entry since the last vacuum, one per job run).
    RETURN QUERY
    WITH done AS (
        UPDATE jobs_job
        SET status = 'completed', completed_at = clock_timestamp(), locked_by = '',
            lease_expires_at = NULL
        WHERE jobs_job.id = p_done AND locked_by = p_worker
          AND (jobs_job.status = 'processing') IS TRUE
        RETURNING jobs_job.id
    ), due AS (
        SELECT j.id FROM jobs_job AS j
        WHERE p_claim AND j.status = 'queued' AND j.run_after <= clock_timestamp()
          AND j.attempts < j.max_attempts
          AND j.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE jobs_job AS j
        SET status = 'processing', attempts = j.attempts + 1,
            started_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
            locked_by = p_worker
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts
    )
    SELECT (SELECT count(*) FROM done), c.id, c.kind::text, c.payload, c.attempts::integer,
        c.max_attempts::integer,
        p_more AND EXISTS (
            SELECT 1 FROM jobs_job AS other
            WHERE other.status = 'queued' AND other.run_after <= clock_timestamp()
              AND other.attempts < other.max_attempts
              AND other.id NOT IN (SELECT due.id FROM due)
              AND other.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
        )
    FROM (SELECT) AS one LEFT JOIN claimed AS c ON true;
END $$;
"""

UPDATE_COUNTS = """
CREATE OR REPLACE FUNCTION jobs_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs_jobcount AS c (kind, status, shard, n)
    SELECT d.kind, d.status, pg_backend_pid() % 16, sum(d.n)
    FROM old_rows AS o JOIN new_rows AS w USING (id)
    CROSS JOIN LATERAL (VALUES (o.kind, o.status, -1), (w.kind, w.status, 1))
        AS d(kind, status, n)
    WHERE o.status IS DISTINCT FROM w.status OR o.kind IS DISTINCT FROM w.kind
    GROUP BY d.kind, d.status
    HAVING sum(d.n) <> 0
    ORDER BY d.kind, d.status
    ON CONFLICT (kind, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END $$;
"""

# 0007's function, as it was.
REVERSE = """
DROP FUNCTION IF EXISTS jobs_finish_and_claim(bigint, text, boolean, float8, boolean, boolean);
CREATE OR REPLACE FUNCTION jobs_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM jobs_count_add((SELECT jsonb_agg(x) FROM (
        SELECT kind, status, sum(n) AS n FROM (
            SELECT o.kind, o.status, -1 AS n FROM old_rows o JOIN new_rows w USING (id)
            WHERE (o.kind, o.status) IS DISTINCT FROM (w.kind, w.status)
            UNION ALL
            SELECT w.kind, w.status, 1 FROM old_rows o JOIN new_rows w USING (id)
            WHERE (o.kind, o.status) IS DISTINCT FROM (w.kind, w.status)
        ) AS changes GROUP BY kind, status) AS x));
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0008_job_error_group")]

    operations = [migrations.RunSQL(FINISH_AND_CLAIM + UPDATE_COUNTS, REVERSE)]
