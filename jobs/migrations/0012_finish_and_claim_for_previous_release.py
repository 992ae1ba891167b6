"""Re-create `jobs_finish_and_claim` for the previous release's workers (issue 31, point 1).

0010 dropped it when `jobs_runner_step` replaced it, but a rolling deploy runs the previous
release's workers against this schema until each is replaced, and they call it for every
job: every drain of an old worker failed until the last one was gone. The rule (invariant
I23, docs/operations.md, "Rolling deploys"): a release's migrations only add; what the
previous release still calls is removed by a later release, once no such worker can run.

The function is 0009's, unchanged, and behaves as that release expects against today's
schema: its claim stamps `started_at`, so 0010's statement trigger records the attempt as
running, and its completion closes that attempt (tests/jobs/test_rolling_deploy.py runs the
previous release's qcluster against these migrations). It may be dropped by a migration of
a release after the one that ships this file.
"""

from django.db import migrations

# 0009's function as it was (copied, not imported: a migration stays as it shipped).
FINISH_AND_CLAIM = """
CREATE OR REPLACE FUNCTION jobs_finish_and_claim(
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

REVERSE = (
    "DROP FUNCTION IF EXISTS "
    "jobs_finish_and_claim(bigint, text, boolean, float8, boolean, boolean);"
)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0011_job_count_deltas")]

    # Back to 0010: dropped again, as 0010 left it (its own reverse re-creates it).
    operations = [migrations.RunSQL(FINISH_AND_CLAIM, REVERSE)]
