"""Issue 38, point 2 (snooze) and the pruning of periodic ticks (point 4's leftovers).

- `jobs_job.snoozes`: how often a handler raised `jobs.Snooze` for the job (jobs/snoozing.py).
  An integer with a database default: PostgreSQL adds it without rewriting the table or
  scanning it (no check constraint to validate), and the previous release's INSERTs, which
  do not name it, get 0 (I23).
- `jobs_jobattempt.outcome` may be `snoozed`: `jobs_attempt_statement()` (migration 0010's
  statement trigger over the transition tables) is replaced in place, same signature, and
  closes an attempt as `snoozed` when the row went back to `queued` with `snoozes` raised;
  before, a row back in `queued` with fewer attempts was only a claim given back
  (`released`, no history row when it had not started). Everything else as in 0010.
- `jobs_jobprunerun.periodic_ticks`: the tick rows a pruning run deleted (jobs/pruning.py).
"""

from django.db import migrations, models

ATTEMPTS_WITH_SNOOZES = """
CREATE OR REPLACE FUNCTION jobs_attempt_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH changed AS (
        SELECT n.id, n.status, n.attempts, n.locked_by, n.started_at, n.last_error,
            n.snoozes, o.snoozes AS old_snoozes,
            o.status AS old_status, o.attempts AS old_attempts, o.started_at AS old_started,
            o.last_error AS old_error,
            coalesce(n.completed_at, n.failed_at, clock_timestamp()) AS finished
        FROM new_rows AS n JOIN old_rows AS o USING (id)
        WHERE o.status = 'processing' OR n.status = 'processing'
    ), finished AS (
        SELECT c.*, CASE
                WHEN c.status = 'completed' THEN 'completed'
                WHEN c.status = 'failed' THEN 'failed'
                -- issue 38: a snooze gives its attempt back too, and says so
                WHEN c.status = 'queued' AND c.snoozes > c.old_snoozes THEN 'snoozed'
                WHEN c.status = 'queued' AND c.attempts < c.old_attempts THEN 'released'
                WHEN c.status = 'queued' THEN 'retried'
                ELSE c.status END AS outcome,
            CASE WHEN c.last_error IS DISTINCT FROM c.old_error
                THEN left(coalesce(c.last_error, ''), 4000) ELSE '' END AS error
        FROM changed AS c
        WHERE c.old_status = 'processing' AND c.status <> 'processing'
    ), closed AS (
        UPDATE jobs_jobattempt AS a
        SET finished_at = f.finished, outcome = f.outcome, error = f.error
        FROM finished AS f
        WHERE f.old_started IS NOT NULL
          AND a.job_id = f.id AND a.number = f.old_attempts AND a.outcome = 'running'
        RETURNING a.id
    )
    INSERT INTO jobs_jobattempt (job_id, number, worker, started_at, finished_at, outcome, error)
    -- started now: a claim that stamps its start, or the runner's mark
    SELECT c.id, c.attempts, left(c.locked_by, 200), c.started_at, NULL, 'running', ''
    FROM changed AS c
    WHERE c.status = 'processing' AND c.started_at IS NOT NULL
      AND (c.old_status <> 'processing' OR c.old_started IS NULL)
    UNION ALL
    -- started and finished since the last statement: one row with its outcome (a claim
    -- given back unstarted was never an attempt)
    SELECT f.id, f.old_attempts, left(o.locked_by, 200), f.started_at, f.finished,
        f.outcome, f.error
    FROM finished AS f JOIN old_rows AS o USING (id)
    WHERE f.old_started IS NULL AND f.outcome <> 'released';
    RETURN NULL;
END $$;
"""


def _attempts_as_in_0010() -> str:
    """0010's function, as it shipped (the reverse)."""
    from importlib import import_module

    batches = import_module("jobs.migrations.0010_runner_batches")
    body = batches.ATTEMPTS.split("CREATE FUNCTION jobs_attempt_statement()", 1)[1]
    body = body.split("CREATE TRIGGER jobs_attempt_statement", 1)[0]
    return "CREATE OR REPLACE FUNCTION jobs_attempt_statement()" + body


class Migration(migrations.Migration):
    dependencies = [("jobs", "0022_claim_honours_kind_caps")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
        migrations.AddField(
            model_name="jobprunerun",
            name="periodic_ticks",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("retried", "Failed, retried"),
                    ("failed", "Failed for good"),
                    ("released", "Given back unstarted (not counted)"),
                    ("snoozed", "Snoozed (not counted)"),
                    ("cancelled", "Cancelled"),
                ],
                default="running",
                max_length=20,
            ),
        ),
        migrations.RunSQL(ATTEMPTS_WITH_SNOOZES, _attempts_as_in_0010()),
    ]
