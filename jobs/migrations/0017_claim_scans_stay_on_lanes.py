"""The claim's scans stay on the lane index next to a pinned snapshot (issue 36, point 2).

While a snapshot is held (a long report, a pg_dump), every job claimed leaves a dead entry in
jobs_job_lane_idx that nothing can remove: the index grows by pages while ANALYZE counts only
its few live rows, so the planner prices a range of it as if each row cost many pages. Two
other indexes also hold the 'queued' rows, jobs_job_claim_idx (kept for the previous
release's `jobs_runner_step_v4`) and jobs_job_status_done_idx (`status, completed_at`); once
autovacuum's ANALYZE ran under the pin (about 90 s into bench/hot_rows.py) the planner took
one of them for the claim's generic plan and for the listener's and the drains' checks, and
walked every 'queued' entry the pin keeps, dead or not, at every call: a runner call went
from 2 ms to 20-30 ms, growing with the pin's age, and two workers doing that took the CPU a
synchronous producer's commits needed.

Each lane's rows come from jobs_job_lane_idx already in `run_after, id` order (its kind and
priority are fixed within the lane), so it is the only plan of the lane scan without a Sort:
with `enable_sort` off for these functions alone, no statistics can move them off it (and
`jit` off with it: a disabled sort's price of 10^10 is far above `jit_above_cost`, and JIT
compiling the claim took 2 s a call).

- `jobs_runner_step_v5` is replaced in place, same signature and results (STYLE.md point 6:
  the running release calls it and gets the better plan); its `more_due` probe gets the same
  order so it too needs the lane index.
- `jobs_first_due_v1(from, to)`, the earliest `run_after` of a queued row that may run in
  that range, by lane: the one statement behind the listener's due check and look-ahead
  (jobs/wakeup.py) and the drains' linger poll (jobs/selectors.py), which each held a copy.
"""

from django.db import migrations

# 0016's function with its plan pinned to the lane index (copied, not imported: a migration
# stays as it shipped).
RUNNER_STEP_V5_ON_LANES = """
CREATE OR REPLACE FUNCTION jobs_runner_step_v5(
    p_worker text, p_done bigint[], p_done_ago float8[], p_mark bigint, p_mark_ago float8,
    p_release bigint[], p_claim integer, p_max_bytes bigint, p_lease_seconds float8,
    p_more boolean, p_slow_kinds text[], p_floor timestamptz, p_async_commit boolean
) RETURNS TABLE (
    completed bigint[], released integer, id bigint, kind text, payload jsonb,
    attempts integer, max_attempts integer, more_due boolean, seen_floor float8
) LANGUAGE plpgsql
-- Its statements' plans are made once per session: with both bounds on run_after values,
-- PL/pgSQL's cost comparison preferred a custom plan at every call (0015's docstring);
-- the generic one here bounds each lane's range by the floor and the clock as parameters.
SET plan_cache_mode = force_generic_plan
-- Each lane's scan is the one plan that needs no Sort (jobs_job_lane_idx gives its rows in
-- run_after, id order): with sorts priced out it stays on that index whatever ANALYZE
-- says of the index's size next to a pinned snapshot (migration 0017). The window and the
-- final ORDER BY sort in every plan alike. The price of a disabled sort (10^10) would set
-- off JIT compilation at every call (2 s a call): off here, where no statement needs it.
SET enable_sort = off
SET jit = off
AS $$
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
    -- Each part runs only when asked for (every UPDATE of jobs_job fires the table's
    -- statement triggers, even over no row); the others go by primary key (`IS TRUE`
    -- keeps them off jobs_job_status_done_idx).
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
    -- By lane: each lane that may run (not a paused kind) gives its first p_claim due rows,
    -- one range of jobs_job_lane_idx with kind and priority equal and both bounds on
    -- run_after Index Conds (the floor and the clock read before the scan); a paused kind's
    -- rows are never read. The lanes' rows are then taken in claim order, p_claim at most
    -- (a row locked but not taken is free again at this statement's commit).
    v_now := clock_timestamp();
    RETURN QUERY
    WITH lanes AS (
        SELECT DISTINCT l.kind, l.priority FROM jobs_joblane AS l
        WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
    ), due AS (
        SELECT r.id, r.priority, r.run_after, r.size, r.slow
        FROM lanes CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_after, pg_column_size(j.payload) AS size,
                j.kind = ANY(p_slow_kinds) AS slow
            FROM jobs_job AS j
            WHERE j.kind = lanes.kind AND j.priority * -1 = lanes.priority * -1 AND j.status = 'queued'
              AND j.run_after >= v_floor AND j.run_after <= v_now
              AND j.attempts < j.max_attempts
              AND NOT (j.id = ANY(coalesce(p_release, '{}')))  -- given back just now: not again
            ORDER BY j.run_after, j.id
            LIMIT p_claim
            FOR UPDATE OF j SKIP LOCKED
        ) AS r
    ), pick AS (
        -- In claim order: always the first; then each row while the stored payloads add up
        -- to at most p_max_bytes and no row before it is of a slow kind, p_claim at most.
        SELECT r.id FROM (
            SELECT due.id, row_number() OVER w AS n,
                sum(due.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes,
                coalesce(bool_or(due.slow) OVER (
                    w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS behind_slow
            FROM due WINDOW w AS (ORDER BY due.priority DESC, due.run_after, due.id)
        ) AS r
        WHERE r.n = 1 OR (r.n <= p_claim AND r.bytes <= p_max_bytes AND NOT r.behind_slow)
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
        p_more AND (
            EXISTS (SELECT 1 FROM due WHERE due.id NOT IN (SELECT pick.id FROM pick))
            OR EXISTS (
                SELECT 1 FROM lanes CROSS JOIN LATERAL (
                    SELECT 1 FROM jobs_job AS other
                    WHERE other.kind = lanes.kind AND other.priority * -1 = lanes.priority * -1
                      AND other.status = 'queued'
                      AND other.run_after >= v_floor AND other.run_after <= v_now
                      AND other.attempts < other.max_attempts
                      AND other.id NOT IN (SELECT due.id FROM due)
                    ORDER BY other.run_after, other.id  -- on the lane index, as above
                    LIMIT 1
                ) AS more
            )
        ),
        -- The floor this scan saw, once per row as epoch seconds: the earliest run_after
        -- of the rows its lanes returned (a lane's rows not returned come after them), or
        -- its clock when they returned none.
        (SELECT extract(epoch FROM least(v_now, min(due.run_after)))::float8 FROM due)
    FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

# 0016's text, put back on reverse.
RUNNER_STEP_V5_AS_IN_0016 = """
CREATE OR REPLACE FUNCTION jobs_runner_step_v5(
    p_worker text, p_done bigint[], p_done_ago float8[], p_mark bigint, p_mark_ago float8,
    p_release bigint[], p_claim integer, p_max_bytes bigint, p_lease_seconds float8,
    p_more boolean, p_slow_kinds text[], p_floor timestamptz, p_async_commit boolean
) RETURNS TABLE (
    completed bigint[], released integer, id bigint, kind text, payload jsonb,
    attempts integer, max_attempts integer, more_due boolean, seen_floor float8
) LANGUAGE plpgsql
-- Its statements' plans are made once per session: with both bounds on run_after values,
-- PL/pgSQL's cost comparison preferred a custom plan at every call (0015's docstring);
-- the generic one here bounds each lane's range by the floor and the clock as parameters.
SET plan_cache_mode = force_generic_plan
AS $$
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
    -- Each part runs only when asked for (every UPDATE of jobs_job fires the table's
    -- statement triggers, even over no row); the others go by primary key (`IS TRUE`
    -- keeps them off jobs_job_status_done_idx).
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
    -- By lane: each lane that may run (not a paused kind) gives its first p_claim due rows,
    -- one range of jobs_job_lane_idx with kind and priority equal and both bounds on
    -- run_after Index Conds (the floor and the clock read before the scan); a paused kind's
    -- rows are never read. The lanes' rows are then taken in claim order, p_claim at most
    -- (a row locked but not taken is free again at this statement's commit).
    v_now := clock_timestamp();
    RETURN QUERY
    WITH lanes AS (
        SELECT DISTINCT l.kind, l.priority FROM jobs_joblane AS l
        WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
    ), due AS (
        SELECT r.id, r.priority, r.run_after, r.size, r.slow
        FROM lanes CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_after, pg_column_size(j.payload) AS size,
                j.kind = ANY(p_slow_kinds) AS slow
            FROM jobs_job AS j
            WHERE j.kind = lanes.kind AND j.priority * -1 = lanes.priority * -1 AND j.status = 'queued'
              AND j.run_after >= v_floor AND j.run_after <= v_now
              AND j.attempts < j.max_attempts
              AND NOT (j.id = ANY(coalesce(p_release, '{}')))  -- given back just now: not again
            ORDER BY j.run_after, j.id
            LIMIT p_claim
            FOR UPDATE OF j SKIP LOCKED
        ) AS r
    ), pick AS (
        -- In claim order: always the first; then each row while the stored payloads add up
        -- to at most p_max_bytes and no row before it is of a slow kind, p_claim at most.
        SELECT r.id FROM (
            SELECT due.id, row_number() OVER w AS n,
                sum(due.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes,
                coalesce(bool_or(due.slow) OVER (
                    w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS behind_slow
            FROM due WINDOW w AS (ORDER BY due.priority DESC, due.run_after, due.id)
        ) AS r
        WHERE r.n = 1 OR (r.n <= p_claim AND r.bytes <= p_max_bytes AND NOT r.behind_slow)
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
        p_more AND (
            EXISTS (SELECT 1 FROM due WHERE due.id NOT IN (SELECT pick.id FROM pick))
            OR EXISTS (
                SELECT 1 FROM lanes CROSS JOIN LATERAL (
                    SELECT 1 FROM jobs_job AS other
                    WHERE other.kind = lanes.kind AND other.priority * -1 = lanes.priority * -1
                      AND other.status = 'queued'
                      AND other.run_after >= v_floor AND other.run_after <= v_now
                      AND other.attempts < other.max_attempts
                      AND other.id NOT IN (SELECT due.id FROM due)
                    LIMIT 1
                ) AS more
            )
        ),
        -- The floor this scan saw, once per row as epoch seconds: the earliest run_after
        -- of the rows its lanes returned (a lane's rows not returned come after them), or
        -- its clock when they returned none.
        (SELECT extract(epoch FROM least(v_now, min(due.run_after)))::float8 FROM due)
    FROM (SELECT) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

FIRST_DUE = """
CREATE FUNCTION jobs_first_due_v1(p_from timestamptz, p_to timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off  -- each lane's range from jobs_job_lane_idx, as the claim's
SET jit = off  -- the disabled sorts' price must not make it compile every call
AS $$
BEGIN
    RETURN (
        SELECT min(first.run_after)
        FROM (
            SELECT DISTINCT l.kind, l.priority FROM jobs_joblane AS l
            WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
        ) AS lane CROSS JOIN LATERAL (
            SELECT j.run_after FROM jobs_job AS j
            WHERE j.kind = lane.kind AND j.priority * -1 = lane.priority * -1
              AND j.status = 'queued'
              AND j.run_after >= p_from AND j.run_after <= p_to
              AND j.attempts < j.max_attempts
            ORDER BY j.run_after, j.id
            LIMIT 1
        ) AS first
    );
END $$;
"""

FIRST_DUE_REVERSE = "DROP FUNCTION IF EXISTS jobs_first_due_v1(timestamptz, timestamptz);"


class Migration(migrations.Migration):
    dependencies = [("jobs", "0016_claim_lanes_and_floor_hints")]

    operations = [
        migrations.RunSQL(RUNNER_STEP_V5_ON_LANES, RUNNER_STEP_V5_AS_IN_0016),
        migrations.RunSQL(FIRST_DUE, FIRST_DUE_REVERSE),
    ]
