"""The claim honours a cap per kind for the whole deployment (issue 37, point 2).

`@handler(kind, concurrency=N)`: at most N jobs of the kind `processing` at once, whichever
process or host claims them. The caps are the rows of `jobs_kindcap` (migration 0021,
written by each worker at start-up, jobs/kind_caps.py).

- `jobs_kind_free_v1(floor, now)`: the capped kinds a claim may take and their free units.
  Race-safe without a row updated per job (no hot row): it takes a transaction-level
  advisory lock per capped kind, in one order (the kinds' hash, then name: no two claimers
  wait on each other in a cycle), then counts each kind's processing rows in a LATER
  statement. In READ COMMITTED each statement of a function takes a new snapshot, so the
  count sees every claim committed by whoever held the lock before; a claimer that took
  the last unit holds the lock until its commit, and the next one counts it. Only capped
  kinds that are not paused, have a due row in their lanes and a unit free by a first
  count without the lock are locked: an uncapped claim never waits, nor one that could
  take nothing of the kind. (A count that was too high only delays: the unit's freeing
  says so, below.) Any other isolation level is refused: its snapshot would miss the
  other claimer's commit.
- `jobs_runner_step_v5` is replaced in place, same signature and results (STYLE.md point
  6): a lane of a capped kind is asked for at most its free units (and p_claim), a kind at
  its cap is not scanned at all, however large its backlog, and over all its lanes a
  kind takes at most its free units. A job held back stays queued: no attempt is spent.
  `more_due` counts only what another claimer could take. Both of 0017's settings stay
  (`enable_sort` and `jit` off: each lane's scan stays on jobs_job_lane_idx).
- `jobs_first_due_v1` (the listener's due check and look-ahead, the drains' linger poll)
  is replaced in place: a kind at its cap is not due, so a lingering drain does not claim
  in a loop what it cannot take, and the listener sends no wake task for it.
- `jobs_job_notify_due_v3`, the trigger function now: as v2, and when a capped kind's row
  leaves processing while a job of that kind is due, it NOTIFYs as for a job queued now,
  with that job's run_after (`jobs_kinds_first_due_v1`): the listener lowers the
  claimers' floors to it and wakes one, so the job starts within a second of the unit's
  freeing, even with no other traffic.

Expand/contract (I23): the previous release calls `jobs_runner_step_v5` and
`jobs_first_due_v1` too, so its claims honour the caps from this migration on (once a
worker of this release has written them); its `job_claim_batch` (tools and tests) does not.
0016's `jobs_job_notify_due_v2` stays; the triggers call v3.
"""

from django.db import migrations

KIND_FREE = """
CREATE FUNCTION jobs_kind_free_v1(p_floor timestamptz, p_now timestamptz)
RETURNS TABLE (kind text, free integer) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off  -- each lane's range from jobs_job_lane_idx, as the claim's
SET jit = off  -- the disabled sorts' price must not make it compile every call
AS $$
#variable_conflict use_column
DECLARE
    v_kinds text[];
    v_kind text;
BEGIN
    -- Which capped kinds to lock: not paused, a unit free by a count without the lock, and
    -- a due row in one of their lanes between the floor and the clock (as the claim scans).
    SELECT coalesce(array_agg(c.kind::text ORDER BY hashtext(c.kind), c.kind), '{}')
    INTO v_kinds
    FROM jobs_kindcap AS c
    WHERE c.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
      AND (SELECT count(*) FROM (
              SELECT 1 FROM jobs_job AS r WHERE r.kind = c.kind AND r.status = 'processing'
              LIMIT c.concurrency) AS busy) < c.concurrency
      AND EXISTS (
          SELECT 1 FROM jobs_joblane AS l CROSS JOIN LATERAL (
              SELECT 1 FROM jobs_job AS j
              WHERE j.kind = l.kind AND j.priority * -1 = l.priority * -1
                AND j.status = 'queued'
                AND j.run_after >= p_floor AND j.run_after <= p_now
                AND j.attempts < j.max_attempts
              ORDER BY j.run_after, j.id
              LIMIT 1
          ) AS due
          WHERE l.kind = c.kind);
    IF cardinality(v_kinds) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a claim of a capped job kind runs in READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING HINT = 'it counts the units in use after taking the kind''s lock; '
                'a transaction snapshot would not see the last claim';
    END IF;
    -- In one order: two claimers that want the same kinds never wait on each other in a
    -- cycle (a hash shared by two kinds is one lock, taken at its first place).
    FOREACH v_kind IN ARRAY v_kinds LOOP
        PERFORM pg_advisory_xact_lock(1784897904, hashtext(v_kind));  -- 'jcap'
    END LOOP;
    -- A later statement: its snapshot sees every claim committed before the locks were ours.
    RETURN QUERY
    SELECT c.kind::text, (c.concurrency - (SELECT count(*) FROM (
              SELECT 1 FROM jobs_job AS r WHERE r.kind = c.kind AND r.status = 'processing'
              LIMIT c.concurrency) AS busy))::integer
    FROM jobs_kindcap AS c WHERE c.kind = ANY(v_kinds);
END $$;
"""

KIND_FREE_REVERSE = "DROP FUNCTION IF EXISTS jobs_kind_free_v1(timestamptz, timestamptz);"

# 0017's function with the caps (copied, not imported: a migration stays as it shipped).
RUNNER_STEP_V5_WITH_CAPS = """
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
-- says of the index's size next to a pinned snapshot (migration 0017). The windows and the
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
    v_capped text[];
    v_free integer[];
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
    -- By lane: each lane that may run (not a paused kind, not a capped kind without a free
    -- unit) gives its first due rows, p_claim at most and, for a capped kind, its free units
    -- at most: one range of jobs_job_lane_idx with kind and priority equal and both bounds
    -- on run_after Index Conds (the floor and the clock read before the scan); the rows of
    -- a paused kind or of a kind at its cap are never read. The lanes' rows are then taken
    -- in claim order, p_claim at most and a capped kind's free units at most over all its
    -- lanes (a row locked but not taken is free again at this statement's commit).
    v_now := clock_timestamp();
    -- Issue 37, point 2: the capped kinds this claim may take, each locked for the rest of
    -- this transaction and its units in use counted after the lock (jobs_kind_free_v1), so
    -- two claimers never both take a kind's last unit. Uncapped kinds take no lock.
    SELECT coalesce(array_agg(f.kind), '{}'), coalesce(array_agg(f.free), '{}')
    INTO v_capped, v_free FROM jobs_kind_free_v1(v_floor, v_now) AS f;
    RETURN QUERY
    WITH capped AS (
        SELECT u.kind, u.free FROM unnest(v_capped, v_free) AS u(kind, free)
    ), lanes AS (
        SELECT DISTINCT l.kind, l.priority, capped.free,
            least(p_claim, coalesce(capped.free, p_claim)) AS take
        FROM jobs_joblane AS l LEFT JOIN capped ON capped.kind = l.kind
        WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
          AND (capped.free > 0  -- issue 37: a capped kind only with a unit free
               OR (capped.kind IS NULL AND l.kind NOT IN (SELECT k.kind FROM jobs_kindcap AS k)))
    ), due AS (
        SELECT r.id, r.kind, r.priority, r.run_after, r.size, r.slow
        FROM lanes CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.priority, j.run_after, pg_column_size(j.payload) AS size,
                j.kind = ANY(p_slow_kinds) AS slow
            FROM jobs_job AS j
            WHERE j.kind = lanes.kind AND j.priority * -1 = lanes.priority * -1
              AND j.status = 'queued'
              AND j.run_after >= v_floor AND j.run_after <= v_now
              AND j.attempts < j.max_attempts
              AND NOT (j.id = ANY(coalesce(p_release, '{}')))  -- given back just now: not again
            ORDER BY j.run_after, j.id
            LIMIT lanes.take
            FOR UPDATE OF j SKIP LOCKED
        ) AS r
    ), allowed AS (
        -- A capped kind's rows over all its lanes, in claim order: its free units at most.
        SELECT d.id, d.priority, d.run_after, d.size, d.slow FROM (
            SELECT due.id, due.kind, due.priority, due.run_after, due.size, due.slow,
                row_number() OVER (PARTITION BY due.kind
                    ORDER BY due.priority DESC, due.run_after, due.id) AS nth
            FROM due
        ) AS d LEFT JOIN capped ON capped.kind = d.kind
        WHERE capped.kind IS NULL OR d.nth <= capped.free
    ), pick AS (
        -- In claim order: always the first; then each row while the stored payloads add up
        -- to at most p_max_bytes and no row before it is of a slow kind, p_claim at most.
        SELECT r.id FROM (
            SELECT allowed.id, row_number() OVER w AS n,
                sum(allowed.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes,
                coalesce(bool_or(allowed.slow) OVER (
                    w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS behind_slow
            FROM allowed WINDOW w AS (ORDER BY allowed.priority DESC, allowed.run_after, allowed.id)
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
            EXISTS (SELECT 1 FROM allowed WHERE allowed.id NOT IN (SELECT pick.id FROM pick))
            OR EXISTS (
                -- beyond a lane's scan: an uncapped lane, or a capped one whose free units
                -- its scan did not exhaust
                SELECT 1 FROM (
                    SELECT lanes.kind, lanes.priority FROM lanes
                    WHERE lanes.free IS NULL OR lanes.free > lanes.take
                ) AS lanes CROSS JOIN LATERAL (
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

# 0017's text, put back on reverse.
RUNNER_STEP_V5_AS_IN_0017 = """
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

FIRST_DUE_WITH_CAPS = """
CREATE OR REPLACE FUNCTION jobs_first_due_v1(p_from timestamptz, p_to timestamptz)
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
              AND l.kind NOT IN (  -- issue 37: a kind at its cap is not due
                  SELECT c.kind FROM jobs_kindcap AS c
                  WHERE (SELECT count(*) FROM (
                      SELECT 1 FROM jobs_job AS r WHERE r.kind = c.kind AND r.status = 'processing'
                      LIMIT c.concurrency) AS busy) >= c.concurrency)
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

FIRST_DUE_AS_IN_0017 = """
CREATE OR REPLACE FUNCTION jobs_first_due_v1(p_from timestamptz, p_to timestamptz)
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

KINDS_FIRST_DUE = """
CREATE FUNCTION jobs_kinds_first_due_v1(p_kinds text[], p_from timestamptz, p_to timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off  -- each lane's range from jobs_job_lane_idx, as the claim's
SET jit = off
AS $$
BEGIN
    RETURN (
        SELECT min(first.run_after)
        FROM (
            SELECT DISTINCT l.kind, l.priority FROM jobs_joblane AS l
            WHERE l.kind = ANY(p_kinds)
              AND l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
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

KINDS_FIRST_DUE_REVERSE = (
    "DROP FUNCTION IF EXISTS jobs_kinds_first_due_v1(text[], timestamptz, timestamptz);"
)

NOTIFY_V3 = """
CREATE FUNCTION jobs_job_notify_due_v3() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due timestamptz;
    freed_kinds text[];
    freed_from timestamptz;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT min(n.run_after) INTO due FROM new_rows AS n
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '60 seconds';
    ELSE
        SELECT min(n.run_after) INTO due FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '60 seconds'
          AND NOT (o.status = 'queued' AND o.run_after = n.run_after);
        -- Issue 37: a row of a capped kind left processing (completed, failed, retried, given
        -- back, reaped, cancelled): a unit is free. If a job of that kind is due and waits,
        -- say so as for a job queued now, with its run_after: the claimers skipped its lane
        -- while the kind was at its cap, so their floors may have passed it
        -- (jobs/floor_hints.py). Looked for from the earliest freed row's run_after: the
        -- kind's jobs are claimed in run_after order, so what waits lies after it, and the
        -- dead entries a pinned snapshot keeps before it are not walked.
        IF EXISTS (SELECT 1 FROM jobs_kindcap) THEN
            SELECT array_agg(DISTINCT o.kind::text), min(o.run_after)
            INTO freed_kinds, freed_from
            FROM old_rows AS o JOIN new_rows AS n ON n.id = o.id
            WHERE o.status = 'processing' AND n.status <> 'processing'
              AND o.kind IN (SELECT c.kind FROM jobs_kindcap AS c);
            IF freed_kinds IS NOT NULL THEN
                due := least(due,
                    jobs_kinds_first_due_v1(freed_kinds, freed_from, clock_timestamp()));
            END IF;
        END IF;
    END IF;
    -- The lanes the claim asks (jobs_runner_step_v5): a row per (kind, priority) ever
    -- queued; nothing is written when the lane exists. No unique key to conflict on: a
    -- second producer of a brand-new lane would wait for the first one's commit; two such
    -- producers at once each write it, and the readers take the distinct lanes.
    INSERT INTO jobs_joblane (kind, priority)
    SELECT DISTINCT n.kind, n.priority FROM new_rows AS n
    WHERE n.status = 'queued' AND NOT EXISTS (
        SELECT 1 FROM jobs_joblane AS l WHERE l.kind = n.kind AND l.priority = n.priority);
    IF due IS NULL THEN
        RETURN NULL;
    ELSIF due <= clock_timestamp() THEN
        -- Due now: the earlier of its run_after and this transaction's start, which every
        -- statement of the transaction shares (its notifications fold into one), and which
        -- is at or below every run_after it committed since: at the commit, the listener
        -- tells the claimers whose floor lies above (jobs/floor_hints.py).
        PERFORM pg_notify('jobs_job_due', extract(epoch FROM least(due, now()))::text);
    ELSE
        PERFORM pg_notify('jobs_job_due', extract(epoch FROM due)::text);
    END IF;
    RETURN NULL;
END
$$;


DROP TRIGGER jobs_job_notify_due_insert ON jobs_job;
DROP TRIGGER jobs_job_notify_due_update ON jobs_job;

CREATE TRIGGER jobs_job_notify_due_insert
    AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v3();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v3();
"""

NOTIFY_V3_REVERSE = """
DROP TRIGGER jobs_job_notify_due_insert ON jobs_job;
DROP TRIGGER jobs_job_notify_due_update ON jobs_job;

CREATE TRIGGER jobs_job_notify_due_insert
    AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v2();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v2();

DROP FUNCTION jobs_job_notify_due_v3();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0021_kind_caps")]

    operations = [
        migrations.RunSQL(KIND_FREE, KIND_FREE_REVERSE),
        migrations.RunSQL(RUNNER_STEP_V5_WITH_CAPS, RUNNER_STEP_V5_AS_IN_0017),
        migrations.RunSQL(FIRST_DUE_WITH_CAPS, FIRST_DUE_AS_IN_0017),
        migrations.RunSQL(KINDS_FIRST_DUE, KINDS_FIRST_DUE_REVERSE),
        migrations.RunSQL(NOTIFY_V3, NOTIFY_V3_REVERSE),
    ]
