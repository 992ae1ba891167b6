"""Rates, histograms and per-kind periods from append-only deltas, rolled up by a schedule
(issue 32: no hot rows).

0002's row triggers (mail, notifications, relays) and 0004's statement trigger on jobs_job
added each event to a `ops_metricseries` / `ops_jobperiod` row in place: every job's start
and end wrote a new version of a row that every other job of its kind writes too. Under a
snapshot held for minutes those versions cannot be removed (108,000 and 72,000 dead
versions behind 48 and 8 rows after 10 minutes at 1,000 jobs/s), and each update walks them.

Here new trigger functions (new names: `ops_job_statement_append`, `ops_metric_mail_append`,
`ops_metric_notification_append`, `ops_metric_relay_append`) only INSERT into
`ops_metricdelta` and `ops_jobperioddelta`, one row per (series, bucket) a statement
observes. `ops_series_rollup()` (the "ops: roll up counters" schedule, every minute) moves
them into `ops_metricseries` and `ops_jobperiod` (shard 0) in one transaction. Readers
(ops.rates, ops.job_periods) sum both in one statement: figures stay exact.

Expand/contract (I23): the old functions (`ops_metric_observe`, `ops_metric_add`,
`ops_metric_job`, `ops_job_period`, `ops_job_statement`, `ops_metric_mail`,
`ops_metric_notification`, `ops_metric_relay`) and both old tables stay; only the triggers
are replaced. The previous release reads the old tables alone: during a deploy its figures
lag by at most a rollup. A later release may drop the old functions.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

DURATION_BOUNDS = "ARRAY[0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]::float8[]"
WAIT_BOUNDS = "ARRAY[0.1, 0.5, 1, 2.5, 5, 15, 60, 300, 900, 3600, 21600]::float8[]"

FORWARD = f"""
-- Element-wise sum of two histograms (an empty array is no observation yet); PL/pgSQL, as a
-- loop over a dozen buckets runs three times faster than unnest/array_agg per call.
CREATE FUNCTION ops_array_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(cardinality(a), 0) = 0 THEN
        RETURN coalesce(b, '{{}}');
    END IF;
    IF coalesce(cardinality(b), 0) = 0 THEN
        RETURN a;
    END IF;
    FOR i IN 1 .. greatest(cardinality(a), cardinality(b)) LOOP
        a[i] := coalesce(a[i], 0) + coalesce(b[i], 0);
    END LOOP;
    RETURN a;
END $$;
CREATE AGGREGATE ops_array_sum(bigint[]) (
    SFUNC = ops_array_add, STYPE = bigint[], INITCOND = '{{}}'
);

-- A histogram of `size` buckets holding `n` observations in bucket `idx` (1-based).
CREATE FUNCTION ops_one_bucket(size int, idx int, n bigint) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT array_fill(0::bigint, ARRAY[idx - 1]) || n || array_fill(0::bigint, ARRAY[size - idx])
$$;

CREATE FUNCTION ops_job_statement_append() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    dur_bounds float8[] := {DURATION_BOUNDS};
    wait_bounds float8[] := {WAIT_BOUNDS};
    obs ops_job_observation[];
BEGIN
    -- What is observed, and when: as 0004's ops_job_statement.
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

    -- /metrics: counters and histograms per kind (ops.rates reads them)
    INSERT INTO ops_metricdelta (metric, label, count, sum, bounds, buckets)
    SELECT x.metric, x.kind, count(*), coalesce(sum(x.value), 0), x.bounds,
        CASE WHEN cardinality(x.bounds) = 0 THEN '{{}}'::bigint[]
            ELSE ops_one_bucket(cardinality(x.bounds) + 1, x.idx::int, count(*)) END
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
    GROUP BY x.metric, x.kind, x.idx, x.bounds;

    -- the health page's per-kind table: 30-minute periods (ops.job_periods reads them)
    INSERT INTO ops_jobperioddelta (start, kind, completed, failed, retried, durations, waits)
    SELECT g.start, g.kind, g.completed, g.failed, g.retried,
        CASE WHEN g.what = 'wait'
            THEN array_fill(0::bigint, ARRAY[cardinality(dur_bounds) + 1])
            ELSE ops_one_bucket(cardinality(dur_bounds) + 1, g.idx::int, g.n) END,
        CASE WHEN g.what = 'wait'
            THEN ops_one_bucket(cardinality(wait_bounds) + 1, g.idx::int, g.n)
            ELSE array_fill(0::bigint, ARRAY[cardinality(wait_bounds) + 1]) END
    FROM (
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
    ) AS g;
    RETURN NULL;
END $$;

-- One counter observation of the mail, notification and relay paths (0002's
-- ops_metric_observe without bounds, appended instead of added in place).
CREATE FUNCTION ops_metric_count_append(p_metric text, p_label text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO ops_metricdelta (metric, label, count, sum, bounds, buckets)
    VALUES (p_metric, left(p_label, 100), 1, 0, '{{}}', '{{}}')
$$;

CREATE FUNCTION ops_metric_mail_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('awaiting_relay', 'processed', 'rejected', 'quarantined', 'discarded') THEN
        PERFORM ops_metric_count_append('inbound_mail', NEW.status);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION ops_metric_notification_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'sent' THEN
        PERFORM ops_metric_count_append('notifications_sent', NEW.kind);
    ELSIF NEW.status = 'failed' THEN
        PERFORM ops_metric_count_append('notifications_failed', NEW.kind);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION ops_metric_relay_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.relay_status IN ('posted', 'inboxed') THEN
        PERFORM ops_metric_count_append('instruction_relays', NEW.relay_status);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS ops_job_statement ON jobs_job;
DROP TRIGGER IF EXISTS ops_metric_mail ON inbound_email_inboundemail;
DROP TRIGGER IF EXISTS ops_metric_mail_insert ON inbound_email_inboundemail;
DROP TRIGGER IF EXISTS ops_metric_notification ON notifications_emailnotification;
DROP TRIGGER IF EXISTS ops_metric_notification_insert ON notifications_emailnotification;
DROP TRIGGER IF EXISTS ops_metric_relay ON inbound_email_reply;
DROP TRIGGER IF EXISTS ops_metric_relay_insert ON inbound_email_reply;

CREATE TRIGGER ops_job_statement_append AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ops_job_statement_append();
CREATE TRIGGER ops_metric_mail_append AFTER UPDATE OF status ON inbound_email_inboundemail
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION ops_metric_mail_append();
CREATE TRIGGER ops_metric_mail_insert_append AFTER INSERT ON inbound_email_inboundemail
    FOR EACH ROW EXECUTE FUNCTION ops_metric_mail_append();
CREATE TRIGGER ops_metric_notification_append
    AFTER UPDATE OF status ON notifications_emailnotification
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION ops_metric_notification_append();
CREATE TRIGGER ops_metric_notification_insert_append
    AFTER INSERT ON notifications_emailnotification
    FOR EACH ROW EXECUTE FUNCTION ops_metric_notification_append();
CREATE TRIGGER ops_metric_relay_append AFTER UPDATE OF relay_status ON inbound_email_reply
    FOR EACH ROW WHEN (OLD.relay_status IS DISTINCT FROM NEW.relay_status)
    EXECUTE FUNCTION ops_metric_relay_append();
CREATE TRIGGER ops_metric_relay_insert_append AFTER INSERT ON inbound_email_reply
    FOR EACH ROW EXECUTE FUNCTION ops_metric_relay_append();

-- Moves every committed delta into ops_metricseries and ops_jobperiod (shard 0); returns
-- the deltas moved. One rollup at a time (the advisory lock); a delta committed after the
-- DELETE's snapshot stays for the next one.
CREATE FUNCTION ops_series_rollup() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    series bigint;
    periods bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('ops_series_rollup'));
    WITH gone AS (
        DELETE FROM ops_metricdelta RETURNING metric, label, count, sum, bounds, buckets
    ), summed AS (
        SELECT metric, label, bounds, sum(count)::bigint AS count, sum(sum) AS sum,
            ops_array_sum(buckets) AS buckets, count(*) AS deltas
        FROM gone GROUP BY metric, label, bounds
    ), added AS (
        INSERT INTO ops_metricseries AS m (metric, label, shard, count, sum, bounds, buckets)
        SELECT metric, label, 0, count, sum, bounds, buckets FROM summed
        ORDER BY metric, label
        ON CONFLICT (metric, label, shard) DO UPDATE SET
            count = m.count + EXCLUDED.count, sum = m.sum + EXCLUDED.sum,
            buckets = ops_array_add(m.buckets, EXCLUDED.buckets)
    )
    SELECT coalesce(sum(deltas), 0) INTO series FROM summed;
    WITH gone AS (
        DELETE FROM ops_jobperioddelta
        RETURNING start, kind, completed, failed, retried, durations, waits
    ), summed AS (
        SELECT start, kind, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
            sum(retried)::bigint AS retried, ops_array_sum(durations) AS durations,
            ops_array_sum(waits) AS waits, count(*) AS deltas
        FROM gone GROUP BY start, kind
    ), added AS (
        INSERT INTO ops_jobperiod AS h (start, kind, shard, completed, failed, retried,
            durations, waits)
        SELECT start, kind, 0, completed, failed, retried, durations, waits FROM summed
        ORDER BY start, kind
        ON CONFLICT (start, kind, shard) DO UPDATE SET
            completed = h.completed + EXCLUDED.completed, failed = h.failed + EXCLUDED.failed,
            retried = h.retried + EXCLUDED.retried,
            durations = ops_array_add(h.durations, EXCLUDED.durations),
            waits = ops_array_add(h.waits, EXCLUDED.waits)
    )
    SELECT coalesce(sum(deltas), 0) INTO periods FROM summed;
    RETURN series + periods;
END $$;
"""

REVERSE = """
SELECT ops_series_rollup();
DROP TRIGGER IF EXISTS ops_job_statement_append ON jobs_job;
DROP TRIGGER IF EXISTS ops_metric_mail_append ON inbound_email_inboundemail;
DROP TRIGGER IF EXISTS ops_metric_mail_insert_append ON inbound_email_inboundemail;
DROP TRIGGER IF EXISTS ops_metric_notification_append ON notifications_emailnotification;
DROP TRIGGER IF EXISTS ops_metric_notification_insert_append ON notifications_emailnotification;
DROP TRIGGER IF EXISTS ops_metric_relay_append ON inbound_email_reply;
DROP TRIGGER IF EXISTS ops_metric_relay_insert_append ON inbound_email_reply;
DROP FUNCTION IF EXISTS ops_series_rollup();
DROP FUNCTION IF EXISTS ops_job_statement_append();
DROP FUNCTION IF EXISTS ops_metric_mail_append();
DROP FUNCTION IF EXISTS ops_metric_notification_append();
DROP FUNCTION IF EXISTS ops_metric_relay_append();
DROP FUNCTION IF EXISTS ops_metric_count_append(text, text);
DROP FUNCTION IF EXISTS ops_one_bucket(int, int, bigint);
DROP AGGREGATE IF EXISTS ops_array_sum(bigint[]);
DROP FUNCTION IF EXISTS ops_array_add(bigint[], bigint[]);
CREATE TRIGGER ops_job_statement AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ops_job_statement();
CREATE TRIGGER ops_metric_mail AFTER UPDATE OF status ON inbound_email_inboundemail
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION ops_metric_mail();
CREATE TRIGGER ops_metric_mail_insert AFTER INSERT ON inbound_email_inboundemail
    FOR EACH ROW EXECUTE FUNCTION ops_metric_mail();
CREATE TRIGGER ops_metric_notification AFTER UPDATE OF status ON notifications_emailnotification
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION ops_metric_notification();
CREATE TRIGGER ops_metric_notification_insert AFTER INSERT ON notifications_emailnotification
    FOR EACH ROW EXECUTE FUNCTION ops_metric_notification();
CREATE TRIGGER ops_metric_relay AFTER UPDATE OF relay_status ON inbound_email_reply
    FOR EACH ROW WHEN (OLD.relay_status IS DISTINCT FROM NEW.relay_status)
    EXECUTE FUNCTION ops_metric_relay();
CREATE TRIGGER ops_metric_relay_insert AFTER INSERT ON inbound_email_reply
    FOR EACH ROW EXECUTE FUNCTION ops_metric_relay();
"""


def _id() -> models.BigAutoField:
    return models.BigAutoField(
        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
    )


class Migration(migrations.Migration):
    dependencies = [("ops", "0004_job_statement_trigger")]

    operations = [
        migrations.CreateModel(
            name="MetricDelta",
            fields=[
                ("id", _id()),
                ("metric", models.CharField(max_length=64)),
                ("label", models.CharField(max_length=100)),
                ("count", models.BigIntegerField()),
                ("sum", models.FloatField(default=0)),
                (
                    "bounds",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.FloatField(), default=list, size=None
                    ),
                ),
                (
                    "buckets",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.BigIntegerField(), default=list, size=None
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="JobPeriodDelta",
            fields=[
                ("id", _id()),
                ("start", models.DateTimeField()),
                ("kind", models.CharField(max_length=100)),
                ("completed", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("retried", models.BigIntegerField(default=0)),
                (
                    "durations",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.BigIntegerField(), default=list, size=None
                    ),
                ),
                (
                    "waits",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.BigIntegerField(), default=list, size=None
                    ),
                ),
            ],
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
