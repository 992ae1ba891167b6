"""The runner claims a batch per statement and hands back what it does not start at once;
the attempt history is written once per statement (issue 22, point 5: throughput).

`jobs_runner_step` replaces 0009's `jobs_finish_and_claim`. In one statement it:

- completes the jobs this worker ran since its last statement (`p_done`, each with how many
  seconds ago its handler started: `started_at` is the handler's start, on the database's
  clock, never the host's);
- marks the job running now as started (`p_mark`), so a long job shows its start and its
  attempt while it runs;
- gives back claimed jobs it has not started (`p_release`): their attempt is undone;
- claims up to `p_claim` due jobs (and at most `p_max_bytes` of stored payload, always at
  least one). A claimed row's `started_at` stays NULL until the runner says when it started.

The runner starts its claimed jobs one after another; when one runs longer than
JOBS_HOLD_UNSTARTED_SECONDS its keeper thread hands the rest back with this same statement,
so a slow job keeps the quick ones behind it for at most that long (point 4).

The attempt history trigger becomes one statement trigger over the transition tables: one
INSERT and one UPDATE per statement instead of a function call per changed row. An attempt
row is written when the job is known to have started: at a claim that stamps `started_at`
(tools and tests, job_claim_batch), when the runner marks it started, or when it finishes
(started and finished within one statement: inserted with its outcome at once). A claim
given back unstarted leaves no attempt row.
"""

from django.db import migrations

RUNNER_STEP = """
DROP FUNCTION IF EXISTS jobs_finish_and_claim(bigint, text, boolean, float8, boolean, boolean);
CREATE FUNCTION jobs_runner_step(
    p_worker text, p_done bigint[], p_done_ago float8[], p_mark bigint, p_mark_ago float8,
    p_release bigint[], p_claim integer, p_max_bytes bigint, p_lease_seconds float8,
    p_more boolean, p_async_commit boolean
) RETURNS TABLE (
    completed bigint[], released integer, id bigint, kind text, payload jsonb,
    attempts integer, max_attempts integer, more_due boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_async_commit THEN
        -- Only when this statement is its own transaction (the runner's caller says so):
        -- see jobs/services.py, job_runner_step, for why nothing durable is at stake.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Every UPDATE is on jobs_job in one statement, so its statement triggers (counts,
    -- wake-up, attempts, rates) fire once, over all the rows. The due scan is served by
    -- jobs_job_claim_idx; the others go by primary key (`IS TRUE` keeps them off
    -- jobs_job_status_done_idx, which holds a dead 'processing' entry per job run).
    RETURN QUERY
    WITH done AS (
        UPDATE jobs_job AS j
        SET status = 'completed', completed_at = clock_timestamp(), locked_by = '',
            lease_expires_at = NULL,
            started_at = coalesce(j.started_at,
                clock_timestamp() - make_interval(secs => greatest(d.ago, 0)))
        FROM unnest(p_done, p_done_ago) AS d(id, ago)
        WHERE j.id = d.id AND j.locked_by = p_worker AND (j.status = 'processing') IS TRUE
        RETURNING j.id
    ), marked AS (
        UPDATE jobs_job AS j
        SET started_at = clock_timestamp() - make_interval(secs => greatest(p_mark_ago, 0))
        WHERE j.id = p_mark AND j.locked_by = p_worker AND (j.status = 'processing') IS TRUE
          AND j.started_at IS NULL
        RETURNING j.id
    ), given_back AS (
        UPDATE jobs_job AS j
        SET status = 'queued', attempts = j.attempts - 1, locked_by = '', started_at = NULL,
            heartbeat_at = NULL, lease_expires_at = NULL
        WHERE j.id = ANY(p_release) AND j.locked_by = p_worker
          AND (j.status = 'processing') IS TRUE
        RETURNING j.id
    ), due AS (
        SELECT j.id, j.priority, j.run_after, pg_column_size(j.payload) AS size
        FROM jobs_job AS j
        WHERE p_claim > 0 AND j.status = 'queued' AND j.run_after <= clock_timestamp()
          AND j.attempts < j.max_attempts
          AND j.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT greatest(p_claim, 0)
        FOR UPDATE SKIP LOCKED
    ), pick AS (
        -- In claim order, the rows whose stored payloads add up to at most p_max_bytes, and
        -- always the first (a job larger than the bound still runs, alone). A window cannot
        -- share a SELECT with FOR UPDATE, hence two steps.
        SELECT r.id FROM (
            SELECT due.id, row_number() OVER w AS n,
                sum(due.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes
            FROM due WINDOW w AS (ORDER BY due.priority DESC, due.run_after, due.id)
        ) AS r
        WHERE r.n = 1 OR r.bytes <= p_max_bytes
    ), claimed AS (
        UPDATE jobs_job AS j
        SET status = 'processing', attempts = j.attempts + 1, started_at = NULL,
            heartbeat_at = clock_timestamp(),
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
            locked_by = p_worker
        FROM pick WHERE j.id = pick.id
        RETURNING j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.priority, j.run_after
    )
    SELECT
        (SELECT coalesce(array_agg(done.id), '{}') FROM done),
        (SELECT count(*)::integer FROM given_back),
        c.id, c.kind::text, c.payload, c.attempts::integer, c.max_attempts::integer,
        p_more AND EXISTS (
            SELECT 1 FROM jobs_job AS other
            WHERE other.status = 'queued' AND other.run_after <= clock_timestamp()
              AND other.attempts < other.max_attempts
              AND other.id NOT IN (SELECT pick.id FROM pick)
              AND other.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
        )
    FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

ATTEMPTS = """
DROP TRIGGER IF EXISTS jobs_attempt_record ON jobs_job;
CREATE OR REPLACE FUNCTION jobs_attempt_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM jobs_jobattempt WHERE job_id = OLD.id;
        RETURN NULL;
    END IF;
    RETURN NULL;
END $$;

-- One call per UPDATE statement. `changed` is every row whose attempt moved: started (a
-- stamping claim, or the runner's mark), finished, or given back.
CREATE FUNCTION jobs_attempt_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (
        SELECT n.id, n.status, n.attempts, n.locked_by, n.started_at, n.last_error,
            o.status AS old_status, o.attempts AS old_attempts, o.started_at AS old_started,
            o.last_error AS old_error,
            coalesce(n.completed_at, n.failed_at, clock_timestamp()) AS finished
        FROM new_rows AS n JOIN old_rows AS o USING (id)
        WHERE o.status = 'processing' OR n.status = 'processing'
    ), finished AS (
        SELECT c.*, CASE
                WHEN c.status = 'completed' THEN 'completed'
                WHEN c.status = 'failed' THEN 'failed'
                WHEN c.status = 'queued' AND c.attempts < c.old_attempts THEN 'released'
                WHEN c.status = 'queued' THEN 'retried'
                ELSE c.status END AS outcome,
            CASE WHEN c.last_error IS DISTINCT FROM c.old_error
                THEN left(coalesce(c.last_error, ''), 4000) ELSE '' END AS error
        FROM changed AS c
        WHERE c.old_status = 'processing' AND c.status <> 'processing'
    ), closed AS (
        UPDATE jobs_jobattempt AS a
        SET finished_at = f.finished, outcome = f.outcome, error = f.error
        FROM finished AS f
        WHERE f.old_started IS NOT NULL
          AND a.job_id = f.id AND a.number = f.old_attempts AND a.outcome = 'running'
        RETURNING a.id
    )
    INSERT INTO jobs_jobattempt (job_id, number, worker, started_at, finished_at, outcome, error)
    -- started now: a claim that stamps its start, or the runner's mark
    SELECT c.id, c.attempts, left(c.locked_by, 200), c.started_at, NULL, 'running', ''
    FROM changed AS c
    WHERE c.status = 'processing' AND c.started_at IS NOT NULL
      AND (c.old_status <> 'processing' OR c.old_started IS NULL)
    UNION ALL
    -- started and finished since the last statement: one row with its outcome (a claim
    -- given back unstarted was never an attempt)
    SELECT f.id, f.old_attempts, left(o.locked_by, 200), f.started_at, f.finished,
        f.outcome, f.error
    FROM finished AS f JOIN old_rows AS o USING (id)
    WHERE f.old_started IS NULL AND f.outcome <> 'released';
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_attempt_statement AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_attempt_statement();
"""

# 0009's function and 0006's row trigger, as they were.
REVERSE = """
DROP TRIGGER IF EXISTS jobs_attempt_statement ON jobs_job;
DROP FUNCTION IF EXISTS jobs_attempt_statement();
DROP FUNCTION IF EXISTS jobs_runner_step(
    text, bigint[], float8[], bigint, float8, bigint[], integer, bigint, float8, boolean, boolean);
"""


def _reverse_sql() -> str:
    """Put back 0006's row trigger function and 0009's function."""
    from importlib import import_module

    attempts = import_module("jobs.migrations.0006_job_attempts_and_paused_kinds")
    runner_step = import_module("jobs.migrations.0009_runner_step")
    row_trigger = attempts.ATTEMPTS.split("CREATE FUNCTION", 1)[1]
    return (
        REVERSE
        + "CREATE OR REPLACE FUNCTION"
        + row_trigger.split("CREATE TRIGGER jobs_attempt_delete", 1)[0]
        + runner_step.FINISH_AND_CLAIM
    )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0009_runner_step")]

    operations = [migrations.RunSQL(RUNNER_STEP + ATTEMPTS, _reverse_sql())]
