"""The due-time wake-up: NOTIFY jobs_job_due with the earliest due time (issue 22).

The trigger of 0002 notified only rows due at once (within a second), so a job due 0.5 s to
a minute ahead waited for the minute tick. Now a statement that inserts a queued row due
within the next minute, or makes a row queued with such a due time (a retry's backoff, a
released claim, retry now), notifies with the earliest such `run_after` as the payload, in
epoch seconds on the database's clock (an empty payload when it is due already, so the
notifications of a transaction that queues due jobs still fold into one). The listener
(jobs/wakeup.py) keeps a timer for it.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobs_job_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
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
    IF due IS NULL THEN
        RETURN NULL;
    ELSIF due <= clock_timestamp() THEN
        PERFORM pg_notify('jobs_job_due', '');  -- due now: folded into one per transaction
    ELSE
        PERFORM pg_notify('jobs_job_due', extract(epoch FROM due)::text);
    END IF;
    RETURN NULL;
END
$$;
"""

# 0002's function, as it was.
REVERSE = """
CREATE OR REPLACE FUNCTION jobs_job_notify_due() RETURNS trigger LANGUAGE plpgsql AS $$
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
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0004_db_clock_defaults")]

    operations = [migrations.RunSQL(CREATE, REVERSE)]
