"""The due trigger says itself when a job is due now (issue 36, point 1; jobs 0029).

`jobs_job_notify_due_v4`, the trigger function now: as v3, but a job due now is announced
as `now <epoch>` (its run_after, or the transaction's start if earlier, as before), and a
job due later as `<epoch>` as before. The listener used to tell the two apart by comparing
the epoch with its own estimate of the database's clock, read at its last ping (every
JOBS_LISTENER_PING_SECONDS): after a step of the clock (NTP, a resumed VM) a job due now
looked due later by the step and waited for the next ping. The trigger decides it on the
database's clock, which wrote the row.

Expand/contract (I23): the previous release's listener reads `now <epoch>` as a payload not
of our trigger's and checks at once, so a job due now is still woken at once; what it loses
until it is replaced is the floor hint for a back-dated job (that job waits for the next full
scan, as before issue 36) and nothing else. A job due later keeps the old payload, which both
releases read. The rate tokens' notifications (`jobs_runner_step_v6`) are unchanged: always
due later. v3 stays for the previous release's reverse.
"""

from django.db import migrations

NOTIFY_V4 = """
CREATE FUNCTION jobs_job_notify_due_v4() RETURNS trigger LANGUAGE plpgsql AS $$
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
        -- As v3 (migration 0022): a unit of a capped kind freed while a job of it waits.
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
    -- The lanes the claim asks (jobs_runner_step_v5), as v2 and v3.
    INSERT INTO jobs_joblane (kind, priority)
    SELECT DISTINCT n.kind, n.priority FROM new_rows AS n
    WHERE n.status = 'queued' AND NOT EXISTS (
        SELECT 1 FROM jobs_joblane AS l WHERE l.kind = n.kind AND l.priority = n.priority);
    IF due IS NULL THEN
        RETURN NULL;
    ELSIF due <= clock_timestamp() THEN
        -- Due now, said so on this clock: the listener wakes a worker without comparing the
        -- epoch (the earlier of its run_after and the transaction's start, for the
        -- claimers' floors) with its estimate of this clock.
        PERFORM pg_notify('jobs_job_due', 'now ' || extract(epoch FROM least(due, now()))::text);
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
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v4();

CREATE TRIGGER jobs_job_notify_due_update
    AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_job_notify_due_v4();
"""

NOTIFY_V4_REVERSE = """
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

DROP FUNCTION jobs_job_notify_due_v4();
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0028_runner_step_claims_beyond_free_slots")]

    operations = [migrations.RunSQL(NOTIFY_V4, NOTIFY_V4_REVERSE)]
