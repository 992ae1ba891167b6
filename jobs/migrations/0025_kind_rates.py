"""A rate per job kind for the whole deployment, taken where the job is claimed (issue 38,
point 3): `@handler(kind, rate="20/s")`.

`jobs_kindrate` holds each limited kind's rate as the workers write it at start-up
(jobs/kind_rates.py), and is the kind's token bucket: the send-rate bucket's design
(notifications/pacing.py, `next_slot_at = greatest(next_slot_at, now) + 1/rate`), one row
per limited kind, written only when a token is taken, so at most at its rate ("No hot
rows", docs/architecture.md); nothing is written for a job of an unlimited kind.

- `jobs_rate_take_v1(next, now, interval)`: the bucket's step, the one formula. A token is
  there when `next` has come; taking it moves `next` to `greatest(next, now - tolerance) +
  interval`: SES's pacing with a tolerance of min(interval / 2, 0.25 s), so a claim a few
  milliseconds late does not push every later token back (the pace holds), while any window
  of the rate's unit still sees at most its count plus one starts (tests/jobs/
  test_kind_rate_property.py). NULL when no token is there: a claim never reserves one ahead.
- `jobs_kind_free_v1` is replaced in place (same signature): besides the capped kinds and
  their free units (0022, unchanged), the limited kinds whose token is there now and which
  have a due row, with 1: their bucket rows locked FOR UPDATE SKIP LOCKED, so two claimers
  never both take one token and neither waits for the other (the one that skips has no
  token to take: at most one is there at a time). A kind both capped and limited gets the
  smaller. A limited kind without its token is not returned, not locked, not written.
- `jobs_runner_step_v6` (this release's claim, jobs 0024) and `jobs_runner_step_v5` (the
  previous release's) are replaced in place (same signatures and results): a limited kind's
  lanes are scanned only with its token, for one job; the token is spent by the statement
  that claims the job (a data-modifying part after the claim, so a token goes only to a job
  taken), and a NOTIFY names the next token's time. A limited kind's lanes are scanned from
  the `run_after` of the last job its bucket gave a token to (`floor_at`, written with the
  token) when that is below the claimer's floor: its floor rose while the kind waited.
- `jobs_first_due_v1` is replaced in place: a limited kind's lane is due at the later of
  its first job's `run_after` and its next token: not due now while it waits, so a drain
  does not claim in a loop what it cannot take, and the listener's look-ahead arms a timer
  at the next token's time. Its lanes are read from the last token's job, as the claim
  reads them: a job whose token came before the caller's floor is due (at the floor).

Expand/contract (I23): the previous release calls `jobs_runner_step_v5`, `jobs_kind_free_v1`
and `jobs_first_due_v1`, all replaced here, so its claims honour the rates from this
migration on (once a worker of this release has written them); its `job_claim_batch` (tools
and tests) does not.
Its listener arms a timer for the NOTIFY's time as for any job due later.
"""

import importlib

import django.db.models.functions.datetime
from django.db import migrations, models

# The reverse puts back 0022's functions and 0024's v6 as they shipped them.
_0022 = importlib.import_module("jobs.migrations.0022_claim_honours_kind_caps")
_0024 = importlib.import_module("jobs.migrations.0024_claim_honours_reserved_slots")

RATE_TAKE = """
CREATE FUNCTION jobs_rate_take_v1(p_next timestamptz, p_now timestamptz, p_interval float8)
RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN p_next IS NULL OR p_next <= p_now THEN
    greatest(p_next, p_now - make_interval(secs => least(p_interval / 2, 0.25)))
    + make_interval(secs => p_interval)
END
$$;
"""

RATE_TAKE_REVERSE = "DROP FUNCTION IF EXISTS jobs_rate_take_v1(timestamptz, timestamptz, float8);"

KIND_FREE_WITH_RATES = """
CREATE OR REPLACE FUNCTION jobs_kind_free_v1(p_floor timestamptz, p_now timestamptz)
RETURNS TABLE (kind text, free integer) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_sort = off  -- each lane's range from jobs_job_lane_idx, as the claim's
SET jit = off  -- the disabled sorts' price must not make it compile every call
AS $$
#variable_conflict use_column
DECLARE
    v_kinds text[];
    v_kind text;
    v_rated text[] := '{}';
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
    -- Issue 38: the rate-limited kinds whose token is there now, not paused, not at a cap
    -- (a capped one only among those locked below), with a due row in one of their lanes
    -- (from the run_after of the last job the bucket gave a token to, when the floor rose
    -- past it: the claim's scan). Their rows locked, skipping one another claimer holds:
    -- that one is taking the token, and there is at most one. A kind without its token, or
    -- with nothing due, is neither locked nor written.
    IF EXISTS (SELECT 1 FROM jobs_kindrate) THEN
        SELECT coalesce(array_agg(t.kind::text), '{}') INTO v_rated FROM (
            SELECT b.kind FROM jobs_kindrate AS b
            WHERE (b.next_slot_at IS NULL OR b.next_slot_at <= p_now)
              AND b.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)
              AND (b.kind = ANY(v_kinds) OR b.kind NOT IN (SELECT c.kind FROM jobs_kindcap AS c))
              AND EXISTS (
                  SELECT 1 FROM jobs_joblane AS l CROSS JOIN LATERAL (
                      SELECT 1 FROM jobs_job AS j
                      WHERE j.kind = l.kind AND j.priority * -1 = l.priority * -1
                        AND j.status = 'queued'
                        AND j.run_after >= least(p_floor, coalesce(b.floor_at, '-infinity'))
                        AND j.run_after <= p_now
                        AND j.attempts < j.max_attempts
                      ORDER BY j.run_after, j.id
                      LIMIT 1
                  ) AS due
                  WHERE l.kind = b.kind)
            FOR UPDATE OF b SKIP LOCKED
        ) AS t;
    END IF;
    IF cardinality(v_kinds) = 0 AND cardinality(v_rated) = 0 THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a claim of a capped or rate-limited job kind runs in READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING HINT = 'it counts the units in use after taking the kind''s lock, and takes '
                'a token from the bucket row as it is now; a transaction snapshot would not '
                'see the last claim';
    END IF;
    -- In one order: two claimers that want the same kinds never wait on each other in a
    -- cycle (a hash shared by two kinds is one lock, taken at its first place).
    FOREACH v_kind IN ARRAY v_kinds LOOP
        PERFORM pg_advisory_xact_lock(1784897904, hashtext(v_kind));  -- 'jcap'
    END LOOP;
    -- A later statement: its snapshot sees every claim committed before the locks were ours.
    -- A limited kind: one job at most (its token); a capped and limited one, the smaller.
    RETURN QUERY
    SELECT coalesce(capped.kind, rated.kind),
        CASE WHEN rated.kind IS NULL THEN capped.free
             ELSE least(coalesce(capped.free, 1), 1) END
    FROM (
        SELECT c.kind::text AS kind, (c.concurrency - (SELECT count(*) FROM (
                  SELECT 1 FROM jobs_job AS r WHERE r.kind = c.kind AND r.status = 'processing'
                  LIMIT c.concurrency) AS busy))::integer AS free
        FROM jobs_kindcap AS c WHERE c.kind = ANY(v_kinds)
    ) AS capped
    FULL JOIN (SELECT u.kind FROM unnest(v_rated) AS u(kind)) AS rated
        ON rated.kind = capped.kind
    WHERE rated.kind IS NOT NULL
       OR capped.kind NOT IN (SELECT b.kind FROM jobs_kindrate AS b);
END $$;
"""

RUNNER_STEP_V5_WITH_RATES = """
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
    -- Issue 38, point 3: with them, the rate-limited kinds whose token is there now (one
    -- job each), their bucket rows locked; a limited kind not given is not scanned.
    SELECT coalesce(array_agg(f.kind), '{}'), coalesce(array_agg(f.free), '{}')
    INTO v_capped, v_free FROM jobs_kind_free_v1(v_floor, v_now) AS f;
    RETURN QUERY
    WITH capped AS (
        SELECT u.kind, u.free FROM unnest(v_capped, v_free) AS u(kind, free)
    ), lanes AS (
        SELECT DISTINCT l.kind, l.priority, capped.free,
            least(p_claim, coalesce(capped.free, p_claim)) AS take,
            -- issue 38: a limited kind's lane from the run_after of the last job its bucket
            -- gave a token to (what waits lies after it), however far claimers' floors
            -- rose while it waited for its token; every other lane from the floor
            CASE WHEN r.kind IS NULL THEN v_floor
                 ELSE least(v_floor, coalesce(r.floor_at, '-infinity')) END AS lower
        FROM jobs_joblane AS l LEFT JOIN capped ON capped.kind = l.kind
            LEFT JOIN jobs_kindrate AS r ON r.kind = l.kind
        WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
          AND (capped.free > 0  -- issue 37: a capped kind only with a unit free
               OR (capped.kind IS NULL AND l.kind NOT IN (SELECT k.kind FROM jobs_kindcap AS k)
                   AND r.kind IS NULL))  -- issue 38: a limited kind only with its token
    ), due AS (
        SELECT r.id, r.kind, r.priority, r.run_after, r.size, r.slow
        FROM lanes CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.priority, j.run_after, pg_column_size(j.payload) AS size,
                j.kind = ANY(p_slow_kinds) AS slow
            FROM jobs_job AS j
            WHERE j.kind = lanes.kind AND j.priority * -1 = lanes.priority * -1
              AND j.status = 'queued'
              AND j.run_after >= lanes.lower AND j.run_after <= v_now
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
    ), spent AS (
        -- Issue 38: each limited kind given a token (its bucket row locked by
        -- jobs_kind_free_v1) that took a job here spends it: the bucket's next token an
        -- interval on. Written only then, so at most at its rate, and never for a job of an
        -- unlimited kind. The NOTIFY names the next token's time: the listeners arm a timer
        -- for it (jobs/wakeup.py), so the kind's next job starts when its token comes.
        UPDATE jobs_kindrate AS b
        SET next_slot_at = jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds),
            floor_at = t.first
        FROM (SELECT c.kind, min(c.run_after) AS first FROM claimed AS c GROUP BY c.kind) AS t
        WHERE b.kind = t.kind AND b.kind = ANY(v_capped)
          AND jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds) IS NOT NULL
        RETURNING pg_notify('jobs_job_due', extract(epoch FROM b.next_slot_at)::text)
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
                    SELECT lanes.kind, lanes.priority, lanes.lower FROM lanes
                    WHERE lanes.free IS NULL OR lanes.free > lanes.take
                ) AS lanes CROSS JOIN LATERAL (
                    SELECT 1 FROM jobs_job AS other
                    WHERE other.kind = lanes.kind AND other.priority * -1 = lanes.priority * -1
                      AND other.status = 'queued'
                      AND other.run_after >= lanes.lower AND other.run_after <= v_now
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
    FROM (SELECT count(*) FROM spent) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

# jobs 0024's jobs_runner_step_v6 (this release's claim, with the reserved slots), with the
# rates as in v5 above (copied, not derived: a migration stays as it shipped).
RUNNER_STEP_V6_WITH_RATES = """
CREATE OR REPLACE FUNCTION jobs_runner_step_v6(
    p_worker text, p_done bigint[], p_done_ago float8[], p_mark bigint, p_mark_ago float8,
    p_release bigint[], p_claim integer, p_max_bytes bigint, p_lease_seconds float8,
    p_more boolean, p_slow_kinds text[], p_floor timestamptz,
    p_reserved_kinds text[], p_reserved_free integer[], p_async_kinds text[],
    p_thread_free integer, p_async_free integer, p_async_commit boolean
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
    -- Issue 38, point 3: with them, the rate-limited kinds whose token is there now (one
    -- job each), their bucket rows locked; a limited kind not given is not scanned.
    SELECT coalesce(array_agg(f.kind), '{}'), coalesce(array_agg(f.free), '{}')
    INTO v_capped, v_free FROM jobs_kind_free_v1(v_floor, v_now) AS f;
    RETURN QUERY
    WITH capped AS (
        SELECT u.kind, u.free FROM unnest(v_capped, v_free) AS u(kind, free)
    ), own AS (
        -- Issue 37, point 3: each reserved kind's free own slots in the claiming process.
        SELECT u.kind, u.free
        FROM unnest(coalesce(p_reserved_kinds, '{}'), coalesce(p_reserved_free, '{}'))
            AS u(kind, free)
    ), lanes AS (
        SELECT DISTINCT l.kind, l.priority, capped.free,
            least(p_claim, coalesce(capped.free, p_claim),
                -- what the process's slots can start of the kind: its own free slots and
                -- the free shared ones of its kind of slot (no limit when not given)
                coalesce(coalesce(own.free, 0) + CASE WHEN l.kind = ANY(p_async_kinds)
                    THEN p_async_free ELSE p_thread_free END, p_claim)) AS take,
            -- issue 38: a limited kind's lane from the run_after of the last job its bucket
            -- gave a token to (what waits lies after it), however far claimers' floors
            -- rose while it waited for its token; every other lane from the floor
            CASE WHEN r.kind IS NULL THEN v_floor
                 ELSE least(v_floor, coalesce(r.floor_at, '-infinity')) END AS lower
        FROM jobs_joblane AS l LEFT JOIN capped ON capped.kind = l.kind
            LEFT JOIN own ON own.kind = l.kind
            LEFT JOIN jobs_kindrate AS r ON r.kind = l.kind
        WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
          AND (capped.free > 0  -- issue 37: a capped kind only with a unit free
               OR (capped.kind IS NULL AND l.kind NOT IN (SELECT k.kind FROM jobs_kindcap AS k)
                   AND r.kind IS NULL))  -- issue 38: a limited kind only with its token
    ), due AS (
        SELECT r.id, r.kind, r.priority, r.run_after, r.size, r.slow
        FROM lanes CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.priority, j.run_after, pg_column_size(j.payload) AS size,
                j.kind = ANY(p_slow_kinds) AS slow
            FROM jobs_job AS j
            WHERE j.kind = lanes.kind AND j.priority * -1 = lanes.priority * -1
              AND j.status = 'queued'
              AND j.run_after >= lanes.lower AND j.run_after <= v_now
              AND j.attempts < j.max_attempts
              AND NOT (j.id = ANY(coalesce(p_release, '{}')))  -- given back just now: not again
            ORDER BY j.run_after, j.id
            LIMIT lanes.take
            FOR UPDATE OF j SKIP LOCKED
        ) AS r
    ), allowed AS (
        -- A capped kind's rows over all its lanes, in claim order: its free units at most.
        SELECT d.id, d.kind, d.priority, d.run_after, d.size, d.slow FROM (
            SELECT due.id, due.kind, due.priority, due.run_after, due.size, due.slow,
                row_number() OVER (PARTITION BY due.kind
                    ORDER BY due.priority DESC, due.run_after, due.id) AS nth
            FROM due
        ) AS d LEFT JOIN capped ON capped.kind = d.kind
        WHERE capped.kind IS NULL OR d.nth <= capped.free
    ), placed AS (
        -- Issue 37, point 3: in claim order, a kind's first rows go to its own free slots
        -- (`nth` within the kind up to its own free ones), the rest need a shared slot of
        -- their kind of slot.
        SELECT a.id, a.priority, a.run_after, a.size, a.slow,
            coalesce(a.kind = ANY(p_async_kinds), false) AS in_async,
            row_number() OVER (PARTITION BY a.kind
                ORDER BY a.priority DESC, a.run_after, a.id) > coalesce(own.free, 0) AS shared
        FROM allowed AS a LEFT JOIN own ON own.kind = a.kind
    ), fits AS (
        -- The rows the claiming process's free slots can start: every row in its kind's own
        -- slots, and the rows needing a shared slot while that kind of slot has one free, in
        -- claim order. So a backfill never takes the slots another kind keeps for itself,
        -- and nothing is claimed to wait for a slot (all of it when no limit is given).
        SELECT s.id, s.priority, s.run_after, s.size, s.slow FROM (
            SELECT placed.*, row_number() OVER (PARTITION BY placed.in_async, placed.shared
                ORDER BY placed.priority DESC, placed.run_after, placed.id) AS shared_nth
            FROM placed
        ) AS s
        WHERE NOT s.shared OR p_thread_free IS NULL
           OR s.shared_nth <= CASE WHEN s.in_async THEN p_async_free ELSE p_thread_free END
    ), pick AS (
        -- In claim order: always the first; then each row while the stored payloads add up
        -- to at most p_max_bytes and no row before it is of a slow kind, p_claim at most.
        SELECT r.id FROM (
            SELECT fits.id, row_number() OVER w AS n,
                sum(fits.size) OVER (w ROWS UNBOUNDED PRECEDING) AS bytes,
                coalesce(bool_or(fits.slow) OVER (
                    w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS behind_slow
            FROM fits WINDOW w AS (ORDER BY fits.priority DESC, fits.run_after, fits.id)
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
    ), spent AS (
        -- Issue 38: each limited kind given a token (its bucket row locked by
        -- jobs_kind_free_v1) that took a job here spends it: the bucket's next token an
        -- interval on. Written only then, so at most at its rate, and never for a job of an
        -- unlimited kind. The NOTIFY names the next token's time: the listeners arm a timer
        -- for it (jobs/wakeup.py), so the kind's next job starts when its token comes.
        UPDATE jobs_kindrate AS b
        SET next_slot_at = jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds),
            floor_at = t.first
        FROM (SELECT c.kind, min(c.run_after) AS first FROM claimed AS c GROUP BY c.kind) AS t
        WHERE b.kind = t.kind AND b.kind = ANY(v_capped)
          AND jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds) IS NOT NULL
        RETURNING pg_notify('jobs_job_due', extract(epoch FROM b.next_slot_at)::text)
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
                    SELECT lanes.kind, lanes.priority, lanes.lower FROM lanes
                    WHERE lanes.free IS NULL OR lanes.free > lanes.take
                ) AS lanes CROSS JOIN LATERAL (
                    SELECT 1 FROM jobs_job AS other
                    WHERE other.kind = lanes.kind AND other.priority * -1 = lanes.priority * -1
                      AND other.status = 'queued'
                      AND other.run_after >= lanes.lower AND other.run_after <= v_now
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
    FROM (SELECT count(*) FROM spent) AS one LEFT JOIN claimed AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""

FIRST_DUE_WITH_RATES = """
CREATE OR REPLACE FUNCTION jobs_first_due_v1(p_from timestamptz, p_to timestamptz)
RETURNS timestamptz LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off  -- each lane's range from jobs_job_lane_idx, as the claim's
SET jit = off  -- the disabled sorts' price must not make it compile every call
AS $$
BEGIN
    RETURN (
        -- A limited kind's job whose due time (its token, or its run_after) lies below
        -- p_from is due at p_from for a check of what is due now (p_from at or below the
        -- clock: a floor), as the claim would take it; never for a look ahead.
        SELECT min(greatest(first.due, p_from))
        FROM (
            SELECT DISTINCT l.kind, l.priority, b.next_slot_at AS token_at,
                -- issue 38: a limited kind's lane from the last token's job, as the claim
                CASE WHEN b.kind IS NULL THEN p_from
                     ELSE least(p_from, coalesce(b.floor_at, '-infinity')) END AS lower
            FROM jobs_joblane AS l LEFT JOIN jobs_kindrate AS b ON b.kind = l.kind
            WHERE l.kind NOT IN (SELECT p.kind FROM jobs_pausedkind AS p)  -- issue 20
              AND l.kind NOT IN (  -- issue 37: a kind at its cap is not due
                  SELECT c.kind FROM jobs_kindcap AS c
                  WHERE (SELECT count(*) FROM (
                      SELECT 1 FROM jobs_job AS r WHERE r.kind = c.kind AND r.status = 'processing'
                      LIMIT c.concurrency) AS busy) >= c.concurrency)
              -- issue 38: a limited kind whose next token comes after p_to is not due
              AND (b.kind IS NULL OR b.next_slot_at IS NULL OR b.next_slot_at <= p_to)
        ) AS lane CROSS JOIN LATERAL (
            -- due at its run_after, a limited kind's job not before its token
            SELECT greatest(j.run_after, lane.token_at) AS due FROM jobs_job AS j
            WHERE j.kind = lane.kind AND j.priority * -1 = lane.priority * -1
              AND j.status = 'queued'
              AND j.run_after >= lane.lower AND j.run_after <= p_to
              AND j.attempts < j.max_attempts
            ORDER BY j.run_after, j.id
            LIMIT 1
        ) AS first
        WHERE first.due >= p_from OR p_from <= statement_timestamp()
    );
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0024_claim_honours_reserved_slots")]

    operations = [
        migrations.CreateModel(
            name="KindRate",
            fields=[
                ("kind", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("rate", models.CharField(help_text='As the handler says it: "20/s", "3/h".', max_length=30)),
                ("interval_seconds", models.FloatField(help_text="Seconds between two tokens.")),
                (
                    "next_slot_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="The token bucket: no job of the kind starts before.",
                        null=True,
                    ),
                ),
                (
                    "floor_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="The run_after of the last job the bucket gave a token to: "
                        "what waits lies at or after it, so the claim scans the kind's lanes "
                        "from there.",
                        null=True,
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={"ordering": ["kind"]},
        ),
        migrations.AddConstraint(
            model_name="kindrate",
            constraint=models.CheckConstraint(
                condition=models.Q(("interval_seconds__gt", 0)),
                name="jobs_kindrate_interval_positive",
            ),
        ),
        migrations.RunSQL(RATE_TAKE, RATE_TAKE_REVERSE),
        migrations.RunSQL(
            KIND_FREE_WITH_RATES,
            _0022.KIND_FREE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),
        ),
        migrations.RunSQL(RUNNER_STEP_V5_WITH_RATES, _0022.RUNNER_STEP_V5_WITH_CAPS),
        migrations.RunSQL(
            RUNNER_STEP_V6_WITH_RATES,
            _0024.RUNNER_STEP_V6.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),
        ),
        migrations.RunSQL(FIRST_DUE_WITH_RATES, _0022.FIRST_DUE_WITH_CAPS),
    ]
