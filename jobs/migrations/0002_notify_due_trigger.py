"""NOTIFY jobs_job_due when a statement inserts a due queued job or makes one due.

Statement-level, with transition tables: one check per statement however many rows it
writes (a bulk insert notifies once), and PostgreSQL folds the identical notifications of
one transaction into one, delivered at commit. "Due" allows a second of clock skew between
the writer's run_after and the database clock. (PostgreSQL allows no column list on a
trigger with transition tables, so the UPDATE trigger runs for every UPDATE statement; its
check is one small join over the rows that statement changed.)
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION jobs_job_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM 1 FROM new_rows AS n
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '1 second'
        LIMIT 1;
    ELSE
        PERFORM 1 FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
        WHERE n.status = 'queued' AND n.run_after <= clock_timestamp() + interval '1 second'
          AND NOT (o.status = 'queued'
                   AND o.run_after <= clock_timestamp() + interval '1 second')
        LIMIT 1;
    END IF;
    IF FOUND THEN
        PERFORM pg_notify('jobs_job_due', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_job_notify_due_insert
    AFTER INSERT ON jobs_job
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due();
"""

DROP = """
DROP TRIGGER IF EXISTS jobs_job_notify_due_update ON jobs_job;
DROP TRIGGER IF EXISTS jobs_job_notify_due_insert ON jobs_job;
DROP FUNCTION IF EXISTS jobs_job_notify_due();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]

    operations = [migrations.RunSQL(CREATE, DROP)]
