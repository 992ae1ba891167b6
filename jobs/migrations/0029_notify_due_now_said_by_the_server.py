"""The due trigger says itself when a job is due now (issue 36, point 1; jobs 0029).

`jobs_job_notify_due_v4`, the trigger function now: as v3, but a job due now is announced
as `now <epoch>` (its run_after, or the transaction's start if earlier, as before), and a
job due later as `<epoch>` as before. The listener used to tell the two apart by comparing
the epoch with its own estimate of the database's clock, read at its last ping (every
JOBS_LISTENER_PING_SECONDS): after a step of the clock (NTP, a resumed VM) a job due now
looked due later by the step and waited for the next ping. The trigger decides it on the
database's clock, which wrote the row. Built from 0022's text of v3 (the function and its two
triggers) by replacements that are each checked, as 0028 builds its statement from 0027's.

Expand/contract (I23): the previous release's listener reads `now <epoch>` as a payload not
of our trigger's and checks at once, so a job due now is still woken at once; what it loses
until it is replaced is the floor hint for a back-dated job (that job waits for the next full
scan, as before issue 36) and nothing else. A job due later keeps the old payload, which both
releases read. The rate tokens' notifications (`jobs_runner_step_v6`, `_v7`) are unchanged: always
due later. v3 stays for the previous release's reverse.
"""

import importlib

from django.db import migrations

_0022 = importlib.import_module("jobs.migrations.0022_claim_honours_kind_caps")


def _from_v3(parts: list[tuple[str, str, int]]) -> str:
    """0022's v3 (the function and its two triggers) with each replacement checked, as 0028
    builds its statement from 0027's: what is not named here stays as 0022 documents it."""
    sql = _0022.NOTIFY_V3
    for old, new, count in parts:
        found = sql.count(old)
        if found != count:
            raise RuntimeError(f"0022's NOTIFY_V3 has {found} of {old!r}, not {count}")
        sql = sql.replace(old, new)
    return sql


NOTIFY_V4 = _from_v3(
    [
        # the function's name, and the two triggers that call it
        ("jobs_job_notify_due_v3()", "jobs_job_notify_due_v4()", 3),
        # a job due now, said so on the database's clock: the listener wakes a worker
        # without comparing the epoch with its estimate of this clock
        (
            "PERFORM pg_notify('jobs_job_due', extract(epoch FROM least(due, now()))::text);",
            "PERFORM pg_notify('jobs_job_due',\n"
            "            'now ' || extract(epoch FROM least(due, now()))::text);",
            1,
        ),
    ]
)

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
