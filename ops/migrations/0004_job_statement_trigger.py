"""The job rates, histograms and 30-minute periods, written once per UPDATE statement of
jobs_job instead of once per changed row (issue 22, point 5: throughput).

0002's `ops_metric_job` and 0003's `ops_job_period` were row triggers: three or four
upserts, each through a PL/pgSQL call, for every claim and every completion — most of the
runner's server time per job (bench/jobs.py). Here one statement trigger reads the
transition tables, groups the observations by series and bucket, and upserts each group
once, in a fixed order (two backends that share a shard take the row locks in the same
order). The runner's statement completes and claims a batch (jobs/migrations/0010), so
twenty no-op jobs cost a handful of upserts.

What is observed, and when — the same figures as before, at the moment the job's start is
known: the runner claims with `started_at` NULL and says when each handler started when it
marks it running or completes it.

- queue wait (`started_at − run_after`): when a job starts — a claim that stamps its start
  (job_claim_batch, SQL), the runner's mark, or a completion or failure of a job whose
  start was not yet written;
- duration, completed / failed attempt / failed for good: when a `processing` row becomes
  completed, queued again (a retry) or failed; a claim given back unstarted (its attempt
  undone) is neither.
"""

from django.db import migrations

DURATION_BOUNDS = "ARRAY[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]::float8[]"
WAIT_BOUNDS = "ARRAY[0.1, 0.5, 1, 2.5, 5, 15, 60, 300, 900, 3600, 21600]::float8[]"

FORWARD = f"""
DROP TRIGGER IF EXISTS ops_metric_job ON jobs_job;
DROP TRIGGER IF EXISTS ops_job_period ON jobs_job;

CREATE TYPE ops_job_observation AS (
    kind text, what text, at timestamptz, value float8, outcome text
);

CREATE FUNCTION ops_metric_add(
    p_metric text, p_label text, p_count bigint, p_sum float8, p_bounds float8[], p_idx int
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(array_length(p_bounds, 1), 0);
    initial bigint[];
BEGIN
    IF n = 0 THEN
        INSERT INTO ops_metricseries AS m (metric, label, shard, count, sum, bounds, buckets)
        VALUES (p_metric, left(p_label, 100), pg_backend_pid() % 16, p_count, 0, '{{}}', '{{}}')
        ON CONFLICT (metric, label, shard) DO UPDATE SET count = m.count + p_count;
        RETURN;
    END IF;
    initial := array_fill(0::bigint, ARRAY[n + 1]);
    initial[p_idx] := p_count;
    INSERT INTO ops_metricseries AS m (metric, label, shard, count, sum, bounds, buckets)
    VALUES (p_metric, left(p_label, 100), pg_backend_pid() % 16, p_count, p_sum, p_bounds,
            initial)
    ON CONFLICT (metric, label, shard) DO UPDATE
        SET count = m.count + p_count, sum = m.sum + p_sum,
            buckets[p_idx] = m.buckets[p_idx] + p_count;
END $$;

CREATE FUNCTION ops_job_statement() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    dur_bounds float8[] := {DURATION_BOUNDS};
    wait_bounds float8[] := {WAIT_BOUNDS};
    g record;
    d bigint[];
    w bigint[];
    obs ops_job_observation[];
BEGIN
    WITH changed AS (
        SELECT left(n.kind, 100) AS kind, n.status, o.status AS old_status,
            n.attempts, o.attempts AS old_attempts, n.started_at, o.started_at AS old_started,
            o.run_after AS old_run_after,
            coalesce(n.completed_at, n.failed_at, clock_timestamp()) AS finished
        FROM new_rows AS n JOIN old_rows AS o USING (id)
        WHERE o.status = 'processing' OR n.status = 'processing'
    ), classified AS (
        SELECT c.*,
            c.old_status = 'processing' AND c.status IN ('completed', 'queued', 'failed')
                AND NOT (c.status = 'queued' AND c.attempts < c.old_attempts) AS finishes
        FROM changed AS c
    )
    SELECT array_agg(ROW(x.kind, x.what, x.at, x.value, x.outcome)::ops_job_observation)
    INTO obs FROM (
    SELECT c.kind AS kind, 'wait' AS what, coalesce(c.started_at, c.finished) AS at,
        greatest(coalesce(extract(epoch FROM coalesce(c.started_at, c.finished)
            - c.old_run_after), 0), 0)::float8 AS value,
        '' AS outcome
    FROM classified AS c
    WHERE (c.status = 'processing' AND c.started_at IS NOT NULL
           AND (c.old_status <> 'processing' OR c.old_started IS NULL))
       OR (c.finishes AND c.old_started IS NULL)
    UNION ALL
    SELECT c.kind, 'duration', c.finished,
        greatest(coalesce(extract(epoch FROM c.finished
            - coalesce(c.started_at, c.old_started, c.finished)), 0), 0)::float8,
        c.status
    FROM classified AS c
    WHERE c.finishes
    ) AS x;
    IF obs IS NULL THEN
        RETURN NULL;  -- a heartbeat, a claim: nothing started or finished
    END IF;

    -- /metrics: counters and histograms per kind (ops.metrics reads them)
    FOR g IN
        SELECT x.metric, x.kind, x.idx, x.bounds, count(*) AS n, sum(x.value) AS total
        FROM (
            SELECT 'job_queue_wait_seconds' AS metric, o.kind, o.value, wait_bounds AS bounds,
                1 + (SELECT count(*) FROM unnest(wait_bounds) AS b WHERE b < o.value) AS idx
            FROM unnest(obs) AS o WHERE o.what = 'wait'
            UNION ALL
            SELECT 'job_duration_seconds', o.kind, o.value, dur_bounds,
                1 + (SELECT count(*) FROM unnest(dur_bounds) AS b WHERE b < o.value)
            FROM unnest(obs) AS o WHERE o.what = 'duration'
            UNION ALL
            SELECT CASE WHEN o.outcome = 'completed' THEN 'jobs_completed'
                    ELSE 'job_attempts_failed' END,
                o.kind, 0, '{{}}'::float8[], 0
            FROM unnest(obs) AS o WHERE o.what = 'duration'
            UNION ALL
            SELECT 'jobs_failed', o.kind, 0, '{{}}'::float8[], 0
            FROM unnest(obs) AS o WHERE o.what = 'duration' AND o.outcome = 'failed'
        ) AS x
        GROUP BY x.metric, x.kind, x.idx, x.bounds
        ORDER BY x.metric, x.kind, x.idx
    LOOP
        PERFORM ops_metric_add(g.metric, g.kind, g.n, g.total, g.bounds, g.idx::int);
    END LOOP;

    -- the health page's per-kind table: 30-minute periods (ops.job_periods reads them)
    FOR g IN
        SELECT date_bin('30 minutes', o.at, timestamptz 'epoch') AS start, o.kind, o.what,
            CASE WHEN o.what = 'wait'
                THEN 1 + (SELECT count(*) FROM unnest(wait_bounds) AS b WHERE b < o.value)
                ELSE 1 + (SELECT count(*) FROM unnest(dur_bounds) AS b WHERE b < o.value)
            END AS idx,
            count(*) AS n,
            count(*) FILTER (WHERE o.outcome = 'completed') AS completed,
            count(*) FILTER (WHERE o.outcome = 'failed') AS failed,
            count(*) FILTER (WHERE o.outcome = 'queued') AS retried
        FROM unnest(obs) AS o
        GROUP BY 1, 2, 3, 4
        ORDER BY 1, 2, 3, 4
    LOOP
        d := array_fill(0::bigint, ARRAY[array_length(dur_bounds, 1) + 1]);
        w := array_fill(0::bigint, ARRAY[array_length(wait_bounds, 1) + 1]);
        IF g.what = 'wait' THEN
            w[g.idx::int] := g.n;
            INSERT INTO ops_jobperiod AS h
                (start, kind, shard, completed, failed, retried, durations, waits)
            VALUES (g.start, g.kind, pg_backend_pid() % 8, 0, 0, 0, d, w)
            ON CONFLICT (start, kind, shard) DO UPDATE
                SET waits[g.idx] = h.waits[g.idx] + g.n;
        ELSE
            d[g.idx::int] := g.n;
            INSERT INTO ops_jobperiod AS h
                (start, kind, shard, completed, failed, retried, durations, waits)
            VALUES (g.start, g.kind, pg_backend_pid() % 8, g.completed, g.failed, g.retried,
                    d, w)
            ON CONFLICT (start, kind, shard) DO UPDATE SET
                completed = h.completed + g.completed, failed = h.failed + g.failed,
                retried = h.retried + g.retried, durations[g.idx] = h.durations[g.idx] + g.n;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER ops_job_statement AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ops_job_statement();
"""

REVERSE = """
DROP TRIGGER IF EXISTS ops_job_statement ON jobs_job;
DROP FUNCTION IF EXISTS ops_job_statement();
DROP FUNCTION IF EXISTS ops_metric_add(text, text, bigint, float8, float8[], int);
DROP TYPE IF EXISTS ops_job_observation;
CREATE TRIGGER ops_metric_job AFTER UPDATE OF status ON jobs_job
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION ops_metric_job();
CREATE TRIGGER ops_job_period AFTER UPDATE OF status ON jobs_job
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION ops_job_period();
"""


class Migration(migrations.Migration):
    dependencies = [("ops", "0003_job_periods"), ("jobs", "0010_runner_batches")]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
