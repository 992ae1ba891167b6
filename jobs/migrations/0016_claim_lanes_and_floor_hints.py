"""Every committed job starts within a second: the claim by lane, and the NOTIFY says where a
job lies (issue 36, point 1).

Two things kept a due job that could run waiting:

- A paused kind's backlog. The claim scanned jobs_job_claim_idx (`-priority, run_after, id
  WHERE status = 'queued'`) and dropped a paused kind's rows with a filter, after reading
  each: with 1,000,000 of them every full scan read them all, and the full scans came
  twenty times that scan apart (jobs/claim_floor.py). Now the claim asks each *lane*, a
  (kind, priority) that has had a queued job (`jobs_joblane`, written by this trigger
  whoever inserts), for its due rows: one range of the new index jobs_job_lane_idx
  (`kind, (priority * -1), run_after, id WHERE status = 'queued'`), kind and priority equal
  and `run_after` between the floor and now, all Index Conds bounding the range. (The
  negated priority keeps jobs_job_claim_idx out of these scans: with a plain `priority =`
  it was bounded as well, and where the statistics knew one kind only the planner took it
  and read the paused kind's rows with a filter.) A lane that
  may not run is not asked: a paused kind today, a kind at its cap or out of its rate
  tomorrow (issues 37, 38), whatever its backlog. Future rows are outside the range too,
  and below the floor the scan does not even walk the dead entries a pinned snapshot keeps.
- A job committed below the claimers' floors (a producer's transaction open for seconds;
  its `run_after` is the transaction's start). The trigger's NOTIFY now names, for jobs due
  at once too, the earliest of their `run_after` and the transaction's start (the same for
  every statement of a transaction, so its notifications still fold into one); the
  listener posts it to the qcluster's claimers when it lies below where a floor could be
  (jobs/floor_hints.py), and they scan from there.

`jobs_runner_step_v5` takes v4's arguments and returns its columns; its `seen_floor` is the
earliest `run_after` among all the rows its lanes returned (claimed or not) or its clock,
so a batch of a higher priority no longer lifts the floor above an older row of a lower one.
Its plans are generic (`plan_cache_mode`, set for the function alone): both bounds are
values, and with those PL/pgSQL re-planned 0014's statement at every call.

Expand/contract (I23): the previous release's workers call `jobs_runner_step_v4` (kept, with
jobs_job_claim_idx, which a later release drops) and parse the NOTIFY payload as a float, as
before; 0005's trigger function `jobs_job_notify_due` stays, the triggers now call v2. The
index is built CONCURRENTLY (this migration is not atomic); the trigger is in place before
the lanes of the rows already queued are written, and CREATE TRIGGER waits for the
transactions writing jobs_job, so no queued row is left without its lane.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

NOTIFY_V2 = """
CREATE FUNCTION jobs_job_notify_due_v2() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due timestamptz;
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT min(n.run_after) INTO due FROM new_rows AS n
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '60 seconds';
    ELSE
        SELECT min(n.run_after) INTO due FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '60 seconds'
          AND NOT (o.status = 'queued' AND o.run_after = n.run_after);
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
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v2();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v2();
"""

NOTIFY_V2_REVERSE = """
DROP TRIGGER jobs_job_notify_due_insert ON jobs_job;
DROP TRIGGER jobs_job_notify_due_update ON jobs_job;

CREATE TRIGGER jobs_job_notify_due_insert
    AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due();

DROP FUNCTION jobs_job_notify_due_v2();
"""

# The lanes of the rows queued before the trigger wrote them (after it is in place).
LANES_OF_QUEUED_ROWS = """
INSERT INTO jobs_joblane (kind, priority)
SELECT DISTINCT j.kind, j.priority FROM jobs_job AS j WHERE j.status = 'queued'
  AND NOT EXISTS (
    SELECT 1 FROM jobs_joblane AS l WHERE l.kind = j.kind AND l.priority = j.priority);
"""

# 0015's function, its due scan and its `more_due` by lane (copied, not imported: a
# migration stays as it shipped).
RUNNER_STEP_V5 = """
CREATE FUNCTION jobs_runner_step_v5(
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

RUNNER_STEP_V5_REVERSE = """
DROP FUNCTION IF EXISTS jobs_runner_step_v5(
    text, bigint[], float8[], bigint, float8, bigint[], integer, bigint, float8, boolean,
    text[], timestamptz, boolean);
"""


class Migration(migrations.Migration):
    atomic = False  # the index is built CONCURRENTLY: the table stays writable

    dependencies = [("jobs", "0015_runner_step_v4_one_floor")]

    operations = [
        migrations.CreateModel(
            name="JobLane",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=100)),
                ("priority", models.IntegerField()),
            ],
            options={
                "indexes": [
                    models.Index(fields=["kind", "priority"], name="jobs_joblane_kind_priority")
                ],
            },
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("kind"),
                models.F("priority") * -1,
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("status", "queued")),
                name="jobs_job_lane_idx",
            ),
        ),
        migrations.RunSQL(NOTIFY_V2, NOTIFY_V2_REVERSE),
        migrations.RunSQL(LANES_OF_QUEUED_ROWS, migrations.RunSQL.noop),
        migrations.RunSQL(RUNNER_STEP_V5, RUNNER_STEP_V5_REVERSE),
    ]
