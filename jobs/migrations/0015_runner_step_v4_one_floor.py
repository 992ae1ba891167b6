"""The runner's statement reports the floor it saw as one float: `jobs_runner_step_v4`.

0014's `jobs_runner_step_v3` returned each claimed row's `run_after` and, on every row, the
clock of its scan: two timestamptz for the worker to parse per job, of which the claim floor
(jobs/claim_floor.py) keeps only the earliest. bench/jobs.py put the cost at 7 to 14 µs of
worker CPU a job, a fifth of the runner's own (issue 32, point 5: keep the speed).
`jobs_runner_step_v4` takes the same arguments and returns, instead of those two columns,
`seen_floor`: the earliest `run_after` it claimed, or its clock when it claimed nothing, as
epoch seconds. And its due scan keeps 0013's upper bound, `run_after <= clock_timestamp()`
(a filter), with the floor alone a value (an Index Cond): with both bounds values, the
generic plan's estimate of a two-sided range made every custom plan look cheaper, and
PL/pgSQL planned v3's statement anew at every call, 10 to 15 µs of server CPU a job. The
scan's clock (`v_now`, read before it) is still the floor it saw when it claims nothing.

Expand/contract (invariant I23): 0010's `jobs_runner_step`, 0013's `jobs_runner_step_v2` and
0014's `jobs_runner_step_v3` stay for the releases that call them; a later release's
migration drops them.
"""

from django.db import migrations

RUNNER_STEP_V4 = """
CREATE FUNCTION jobs_runner_step_v4(
    p_worker text, p_done bigint[], p_done_ago float8[], p_mark bigint, p_mark_ago float8,
    p_release bigint[], p_claim integer, p_max_bytes bigint, p_lease_seconds float8,
    p_more boolean, p_slow_kinds text[], p_floor timestamptz, p_async_commit boolean
) RETURNS TABLE (
    completed bigint[], released integer, id bigint, kind text, payload jsonb,
    attempts integer, max_attempts integer, more_due boolean, seen_floor float8
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_completed bigint[] := '{}';
    v_released integer := 0;
    v_now timestamptz;
    v_floor timestamptz := coalesce(p_floor, '-infinity');
BEGIN
    IF p_async_commit THEN
        -- Only when this statement is its own transaction and every completion in it is of
        -- a kind declared idempotent (jobs/services.py, job_runner_step).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Each part runs only when asked for: every UPDATE of jobs_job fires the table's
    -- statement triggers (counts, wake-up, attempts, rates), even over no row, and 0010's
    -- one statement of four data-modifying CTEs fired them four times. The due scan is
    -- served by jobs_job_claim_idx; the others go by primary key (`IS TRUE` keeps them off
    -- jobs_job_status_done_idx, which holds a dead 'processing' entry per job run).
    IF cardinality(p_done) > 0 THEN
        WITH done AS (
            UPDATE jobs_job AS j
            SET status = 'completed', completed_at = clock_timestamp(), locked_by = '',
                lease_expires_at = NULL,
                started_at = coalesce(j.started_at,
                    clock_timestamp() - make_interval(secs => greatest(d.ago, 0)))
            FROM unnest(p_done, p_done_ago) AS d(id, ago)
            WHERE j.id = d.id AND j.locked_by = p_worker AND (j.status = 'processing') IS TRUE
            RETURNING j.id
        )
        SELECT coalesce(array_agg(done.id), '{}') INTO v_completed FROM done;
    END IF;
    IF p_mark IS NOT NULL THEN
        UPDATE jobs_job AS j
        SET started_at = clock_timestamp() - make_interval(secs => greatest(p_mark_ago, 0))
        WHERE j.id = p_mark AND j.locked_by = p_worker AND (j.status = 'processing') IS TRUE
          AND j.started_at IS NULL;
    END IF;
    IF cardinality(p_release) > 0 THEN
        WITH given_back AS (
            UPDATE jobs_job AS j
            SET status = 'queued', attempts = j.attempts - 1, locked_by = '',
                started_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL
            WHERE j.id = ANY(p_release) AND j.locked_by = p_worker
              AND (j.status = 'processing') IS TRUE
            RETURNING j.id
        )
        SELECT count(*)::integer INTO v_released FROM given_back;
    END IF;
    IF coalesce(p_claim, 0) <= 0 THEN
        RETURN QUERY SELECT v_completed, v_released, NULL::bigint, NULL::text, NULL::jsonb,
            NULL::integer, NULL::integer, false, NULL::float8;
        RETURN;
    END IF;
    -- The floor is a value, an Index Cond on jobs_job_claim_idx's second column checked on
    -- the index tuple: below the caller's floor the scan walks the entries of rows claimed
    -- since an old snapshot began without visiting their dead heap tuples. The upper bound
    -- stays clock_timestamp(), a filter, as in 0013: with both bounds values (0014), the
    -- generic plan's estimate for a two-sided range made every custom plan look cheaper,
    -- so PL/pgSQL planned this statement anew at every call (10-15 µs a job of server CPU,
    -- bench/jobs.py); with one, the plan is made once per session and reused.
    v_now := clock_timestamp();
    RETURN QUERY
    WITH due AS (
        SELECT j.id, j.priority, j.run_after, pg_column_size(j.payload) AS size,
            j.kind = ANY(p_slow_kinds) AS slow
        FROM jobs_job AS j
        WHERE j.status = 'queued' AND j.run_after <= clock_timestamp() AND j.run_after >= v_floor
          AND j.attempts < j.max_attempts
          AND j.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
          AND NOT (j.id = ANY(coalesce(p_release, '{}')))  -- given back just now: not again
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT p_claim
        FOR UPDATE SKIP LOCKED
    ), pick AS (
        -- In claim order: always the first; then each row while the stored payloads add up
        -- to at most p_max_bytes and no row before it is of a slow kind (the batch ends
        -- with the first slow job: nothing waits behind it to be given back).
        SELECT r.id FROM (
            SELECT due.id, row_number() OVER w AS n,
                sum(due.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes,
                coalesce(bool_or(due.slow) OVER (
                    w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS behind_slow
            FROM due WINDOW w AS (ORDER BY due.priority DESC, due.run_after, due.id)
        ) AS r
        WHERE r.n = 1 OR (r.bytes <= p_max_bytes AND NOT r.behind_slow)
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
        v_completed, v_released,
        c.id, c.kind::text, c.payload, c.attempts::integer, c.max_attempts::integer,
        p_more AND EXISTS (
            SELECT 1 FROM jobs_job AS other
            WHERE other.status = 'queued' AND other.run_after <= clock_timestamp()
              AND other.run_after >= v_floor AND other.attempts < other.max_attempts
              AND other.id NOT IN (SELECT pick.id FROM pick)
              AND other.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
        ),
        -- The floor this scan saw, once per row as epoch seconds (a float costs the caller
        -- next to nothing to read; two timestamptz per row were most of 0014's cost): the
        -- earliest run_after it claimed, or its clock when it claimed nothing.
        extract(epoch FROM least(v_now, min(c.run_after) OVER ()))::float8
    FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

REVERSE = """
DROP FUNCTION IF EXISTS jobs_runner_step_v4(
    text, bigint[], float8[], bigint, float8, bigint[], integer, bigint, float8, boolean,
    text[], timestamptz, boolean);
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0014_runner_step_v3_claim_floor")]

    operations = [migrations.RunSQL(RUNNER_STEP_V4, REVERSE)]
