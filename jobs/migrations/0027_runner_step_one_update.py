"""The runner's completions and claim in one UPDATE of jobs_job (issue 37, point 4: the
idempotent no-op's CPU per job).

Every UPDATE of jobs_job fires the table's four statement triggers (the attempt history,
the counts' deltas, the wake-up, the metrics' and periods' deltas), each a PL/pgSQL call
over the statement's transition tables, even over no row: a part per firing (the call, its
plans' start-up) and a part per row (docs/performance.md). A drain's step completed the
jobs its slots finished in one UPDATE and claimed the next ones in another, so they fired
twice a step. `jobs_runner_step_v6` (0025's, the claim of this release) is replaced in
place, same signature and results: when the step completes and claims, and no kind is
capped, and it neither marks nor gives back, the completions are rows of the claim's own
UPDATE (`claimed`, told apart by `done`), so the triggers fire once, over both. Each row's
new values are those its own statement wrote, so what the triggers record (history, counts,
histograms, periods) is the same.

`jobs_kind_free_v1` is not called when `jobs_kindcap` and `jobs_kindrate` are both empty: it
would return no row (a PL/pgSQL call and its statements each step, for nothing).

Kept as two statements when a capped kind exists: `jobs_kind_free_v1` counts a capped
kind's units in use before the claim's statement, and must see this step's completions
done (a unit freed by a completion is taken by the same step's claim, 0022). A cap added
while the step runs is read by `jobs_kind_free_v1` after the merge was decided: the step
then counts its own completions as in use, and claims less, never more.

Expand/contract (I23): the previous release calls the same function with the same
arguments and gets the same results. The reverse puts back 0025's function.
"""

import importlib

from django.db import migrations

_0025 = importlib.import_module("jobs.migrations.0025_kind_rates")

RUNNER_STEP_V6_ONE_UPDATE = """CREATE OR REPLACE FUNCTION jobs_runner_step_v6(
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
    -- Issue 37, point 4 (migration 0027): the completions go in the claim's UPDATE, so the
    -- table's statement triggers fire once for both. Not when a capped kind exists (its
    -- units are counted before the claim, and must see this step's completions done), nor
    -- beside a mark or a hand-back (their own statements, in their order, as before).
    v_merge boolean := coalesce(cardinality(p_done), 0) > 0 AND coalesce(p_claim, 0) > 0
        AND p_mark IS NULL AND coalesce(cardinality(p_release), 0) = 0
        AND NOT EXISTS (SELECT 1 FROM jobs_kindcap);
BEGIN
    IF p_async_commit THEN
        -- Only when this statement is its own transaction and every completion in it is of
        -- a kind declared idempotent (jobs/runner_step.py, job_runner_step).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- Each part runs only when asked for (every UPDATE of jobs_job fires the table's
    -- statement triggers, even over no row); the others go by primary key (`IS TRUE`
    -- keeps them off jobs_job_status_done_idx).
    IF cardinality(p_done) > 0 AND NOT v_merge THEN
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
    -- Not called when no kind is capped or rate-limited: it would return nothing (0027).
    IF EXISTS (SELECT 1 FROM jobs_kindcap) OR EXISTS (SELECT 1 FROM jobs_kindrate) THEN
        SELECT coalesce(array_agg(f.kind), '{}'), coalesce(array_agg(f.free), '{}')
        INTO v_capped, v_free FROM jobs_kind_free_v1(v_floor, v_now) AS f;
    ELSE
        v_capped := '{}';
        v_free := '{}';
    END IF;
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
        -- The picked rows claimed and, with v_merge, this step's completions completed, in
        -- one UPDATE (one firing of the table's statement triggers). A completion as in its
        -- own statement: the row's own worker's, still `processing` (a row the reaper took
        -- meanwhile is rechecked and left alone), `started_at` kept or stamped; `done` tells
        -- the two apart. A picked row is `queued`, so never one of the completions.
        UPDATE jobs_job AS j
        SET status = CASE WHEN t.done THEN 'completed' ELSE 'processing' END,
            attempts = CASE WHEN t.done THEN j.attempts ELSE j.attempts + 1 END,
            started_at = CASE WHEN t.done THEN coalesce(j.started_at,
                clock_timestamp() - make_interval(secs => greatest(t.ago, 0))) END,
            completed_at = CASE WHEN t.done THEN clock_timestamp() ELSE j.completed_at END,
            heartbeat_at = CASE WHEN t.done THEN j.heartbeat_at ELSE clock_timestamp() END,
            lease_expires_at = CASE WHEN t.done THEN NULL
                ELSE clock_timestamp() + make_interval(secs => p_lease_seconds) END,
            locked_by = CASE WHEN t.done THEN '' ELSE p_worker END
        FROM (
            SELECT pick.id, false AS done, NULL::float8 AS ago FROM pick
            UNION ALL
            SELECT d.id, true, d.ago FROM unnest(p_done, p_done_ago) AS d(id, ago)
            WHERE v_merge
        ) AS t
        WHERE j.id = t.id
          AND (NOT t.done OR (j.locked_by = p_worker AND (j.status = 'processing') IS TRUE))
        RETURNING t.done, j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.priority,
            j.run_after
    ), spent AS (
        -- Issue 38: each limited kind given a token (its bucket row locked by
        -- jobs_kind_free_v1) that took a job here spends it: the bucket's next token an
        -- interval on. Written only then, so at most at its rate, and never for a job of an
        -- unlimited kind. The NOTIFY names the next token's time: the listeners arm a timer
        -- for it (jobs/wakeup.py), so the kind's next job starts when its token comes.
        UPDATE jobs_kindrate AS b
        SET next_slot_at = jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds),
            floor_at = t.first
        FROM (SELECT c.kind, min(c.run_after) AS first FROM claimed AS c
              WHERE NOT c.done GROUP BY c.kind) AS t
        WHERE b.kind = t.kind AND b.kind = ANY(v_capped)
          AND jobs_rate_take_v1(b.next_slot_at, v_now, b.interval_seconds) IS NOT NULL
        RETURNING pg_notify('jobs_job_due', extract(epoch FROM b.next_slot_at)::text)
    )
    SELECT
        CASE WHEN v_merge
            THEN (SELECT coalesce(array_agg(x.id), '{}') FROM claimed AS x WHERE x.done)
            ELSE v_completed END,
        v_released,
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
    FROM (SELECT count(*) FROM spent) AS one
        LEFT JOIN (SELECT * FROM claimed WHERE NOT claimed.done) AS c ON true
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0026_cancel_requested_and_job_stops")]

    operations = [
        migrations.RunSQL(RUNNER_STEP_V6_ONE_UPDATE, _0025.RUNNER_STEP_V6_WITH_RATES),
    ]
