"""Job counts from append-only deltas, rolled up by a schedule (issue 32: no hot rows).

0007/0009's statement triggers added each statement's change to a few `jobs_jobcount` rows
in place (`ON CONFLICT … DO UPDATE`): every enqueue and every runner statement wrote a new
version of a row that every other job writes too. While any session holds a snapshot for
minutes (a report in REPEATABLE READ, a forgotten BEGIN, pg_dump), none of those versions
can be removed, each update walks the ever longer chain, and an INSERT of a job took
10-20 ms after 10 minutes (266,000 dead versions behind 48 rows).

Here the triggers (new names, `jobs_count_delta_*`) only INSERT one row per (kind, status)
a statement changes into `jobs_jobcountdelta`; nothing on a job's path updates a shared
row. `jobs_count_rollup()` (the "ops: roll up counters" schedule, every minute) moves the
deltas into `jobs_jobcount` in one transaction (DELETE … RETURNING, then one upsert per
(kind, status)): one new version per row per minute. Readers sum both tables in one
statement (jobs.selectors), so the counts stay exact.

Expand/contract (I23): the old trigger functions (`jobs_count_insert`, `jobs_count_update`,
`jobs_count_delete`, `jobs_count_truncate`, `jobs_count_add`) and the `jobs_jobcount`
table stay; only their triggers are replaced. The previous release reads `jobs_jobcount`
alone: during a deploy its counts lag by at most a rollup. A later release may drop the old
functions.
"""

from django.db import migrations, models

FORWARD = """
DROP TRIGGER IF EXISTS jobs_count_insert ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_update ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_delete ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_truncate ON jobs_job;

CREATE FUNCTION jobs_count_delta_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs_jobcountdelta (kind, status, n)
    SELECT kind, status, count(*) FROM new_rows GROUP BY kind, status;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_count_delta_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs_jobcountdelta (kind, status, n)
    SELECT kind, status, -count(*) FROM old_rows GROUP BY kind, status;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_count_delta_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs_jobcountdelta (kind, status, n)
    SELECT d.kind, d.status, sum(d.n)
    FROM old_rows AS o JOIN new_rows AS w USING (id)
    CROSS JOIN LATERAL (VALUES (o.kind, o.status, -1), (w.kind, w.status, 1))
        AS d(kind, status, n)
    WHERE o.status IS DISTINCT FROM w.status OR o.kind IS DISTINCT FROM w.kind
    GROUP BY d.kind, d.status
    HAVING sum(d.n) <> 0;
    RETURN NULL;
END $$;

CREATE FUNCTION jobs_count_delta_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM jobs_jobcount;
    DELETE FROM jobs_jobcountdelta;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_count_delta_insert AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION jobs_count_delta_insert();
CREATE TRIGGER jobs_count_delta_update AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_delta_update();
CREATE TRIGGER jobs_count_delta_delete AFTER DELETE ON jobs_job
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT
    EXECUTE FUNCTION jobs_count_delta_delete();
CREATE TRIGGER jobs_count_delta_truncate AFTER TRUNCATE ON jobs_job
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_delta_truncate();

-- Moves every committed delta into jobs_jobcount (shard 0); returns the deltas moved. A
-- delta committed after the DELETE's snapshot stays for the next rollup; two rollups at
-- once take turns (the advisory lock), so neither waits on the other's row locks.
CREATE FUNCTION jobs_count_rollup() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    moved bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('jobs_count_rollup'));
    WITH gone AS (
        DELETE FROM jobs_jobcountdelta RETURNING kind, status, n
    ), summed AS (
        SELECT kind, status, sum(n)::bigint AS n, count(*) AS deltas
        FROM gone GROUP BY kind, status
    ), added AS (
        INSERT INTO jobs_jobcount AS c (kind, status, shard, n)
        SELECT kind, status, 0, n FROM summed WHERE n <> 0 ORDER BY kind, status
        ON CONFLICT (kind, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n
    )
    SELECT coalesce(sum(deltas), 0) INTO moved FROM summed;
    RETURN moved;
END $$;
"""

REVERSE = """
DROP TRIGGER IF EXISTS jobs_count_delta_insert ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_delta_update ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_delta_delete ON jobs_job;
DROP TRIGGER IF EXISTS jobs_count_delta_truncate ON jobs_job;
SELECT jobs_count_rollup();
DROP FUNCTION IF EXISTS jobs_count_rollup();
DROP FUNCTION IF EXISTS jobs_count_delta_insert();
DROP FUNCTION IF EXISTS jobs_count_delta_update();
DROP FUNCTION IF EXISTS jobs_count_delta_delete();
DROP FUNCTION IF EXISTS jobs_count_delta_truncate();
CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_insert();
CREATE TRIGGER jobs_count_update AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_update();
CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs_job
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_delete();
CREATE TRIGGER jobs_count_truncate AFTER TRUNCATE ON jobs_job
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_truncate();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0010_runner_batches")]

    operations = [
        migrations.CreateModel(
            name="JobCountDelta",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=100)),
                ("status", models.CharField(max_length=20)),
                ("n", models.BigIntegerField()),
            ],
        ),
        migrations.RunSQL(FORWARD, REVERSE),
    ]
