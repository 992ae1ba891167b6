"""Unique jobs, tags and metadata, retention per state (issue 38, points 1, 5, 6 and 7).

Only adds (I23: the previous release's workers and producers keep working; they never
write the new columns, which are NULL for their rows):

- `jobs_job.unique_key`, `unique_for`, `tags`, `meta`: nullable, no default, so adding them
  rewrites nothing and a job without them stores no bytes for them;
- the partial unique index `jobs_job_unique_key` (`kind, unique_key WHERE unique_key IS NOT
  NULL AND status IN ('queued', 'processing')`), the GIN indexes on tags and on meta
  (`jsonb_path_ops`, for `@>`) for rows that have them, and `(cancelled_at) WHERE status =
  'cancelled'` for pruning: each built CONCURRENTLY (this migration is not atomic), so
  producers and workers go on while the table is read;
- the checks on meta (a JSON object) and unique_for (positive, with a key), added NOT VALID
  and then validated, which reads the table without blocking its writers;
- `jobs_jobuniquekey` (a key kept after its job completed, until `expires_at`) and the row
  trigger `jobs_job_unique_key_kept` that writes it in the completion's transaction when the
  completed job has a `unique_for`, whoever completes it (`WHEN` in the trigger's
  definition: every other update only evaluates the condition);
- `jobs_enqueue_unique(kind, payload, unique_key, unique_for, priority, max_attempts,
  run_after, tags, meta)`: `enqueue`'s rule in SQL, for any producer (docs/jobs.md);
- `jobs_jobprunerun`: what each pruning run deleted, for the health page.
"""

from datetime import timedelta

import django.contrib.postgres.fields
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import F, Func, Q, Value
from django.db.models.functions import Now
from django.db.models.lookups import Exact

UNIQUE_INDEX = """
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_job_unique_key ON jobs_job (kind, unique_key)
WHERE unique_key IS NOT NULL AND status IN ('queued', 'processing')
"""

CHECKS = """
ALTER TABLE jobs_job ADD CONSTRAINT jobs_job_meta_is_object
    CHECK (meta IS NULL OR jsonb_typeof(meta) = 'object') NOT VALID;
ALTER TABLE jobs_job ADD CONSTRAINT jobs_job_unique_for_positive_with_key
    CHECK (unique_for IS NULL OR (unique_key IS NOT NULL AND unique_for > interval '0'))
    NOT VALID;
"""
CHECKS_VALIDATE = """
ALTER TABLE jobs_job VALIDATE CONSTRAINT jobs_job_meta_is_object;
ALTER TABLE jobs_job VALIDATE CONSTRAINT jobs_job_unique_for_positive_with_key;
"""
CHECKS_REVERSE = """
ALTER TABLE jobs_job DROP CONSTRAINT jobs_job_meta_is_object;
ALTER TABLE jobs_job DROP CONSTRAINT jobs_job_unique_for_positive_with_key;
"""

KEY_KEPT = """
CREATE FUNCTION jobs_job_unique_key_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO jobs_jobuniquekey (kind, unique_key, job_id, expires_at)
    VALUES (NEW.kind, NEW.unique_key, NEW.id,
            coalesce(NEW.completed_at, clock_timestamp()) + NEW.unique_for)
    ON CONFLICT (kind, unique_key) DO UPDATE
        SET job_id = EXCLUDED.job_id, expires_at = EXCLUDED.expires_at;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_job_unique_key_kept
    AFTER UPDATE OF status ON jobs_job
    FOR EACH ROW
    WHEN (NEW.status = 'completed' AND OLD.status IS DISTINCT FROM 'completed'
          AND NEW.unique_for IS NOT NULL AND NEW.unique_key IS NOT NULL)
    EXECUTE FUNCTION jobs_job_unique_key_kept();
"""
KEY_KEPT_REVERSE = """
DROP TRIGGER jobs_job_unique_key_kept ON jobs_job;
DROP FUNCTION jobs_job_unique_key_kept();
"""

# One job with a key, decided by the database. In order: a completed job's kept key (its
# period); else the insert, which `ON CONFLICT` turns into nothing when a live job holds the
# key (waiting for that job's transaction when it is not committed: a rollback lets this
# insert). A completion that committed during that wait keeps its key in a row this
# statement's snapshot could not see: the next statement sees it, and the insert is taken
# back (in the caller's transaction: nobody saw it). A live job that ended between the
# conflict and the read of its id: once more from the start.
ENQUEUE_UNIQUE = """
CREATE FUNCTION jobs_enqueue_unique(
    p_kind text, p_payload jsonb, p_unique_key text, p_unique_for interval DEFAULT NULL,
    p_priority integer DEFAULT 0, p_max_attempts integer DEFAULT 5,
    p_run_after timestamptz DEFAULT NULL, p_tags text[] DEFAULT NULL, p_meta jsonb DEFAULT NULL
) RETURNS TABLE (job_id bigint, inserted boolean) LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_unique_key IS NULL THEN
        RAISE EXCEPTION 'jobs_enqueue_unique: p_unique_key must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    LOOP
        SELECT k.job_id INTO v_id FROM jobs_jobuniquekey AS k
        WHERE k.kind = p_kind AND k.unique_key = p_unique_key
          AND k.expires_at > clock_timestamp();
        IF FOUND THEN
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
        v_id := NULL;
        INSERT INTO jobs_job AS j (
            kind, payload, status, priority, attempts, max_attempts, run_after, locked_by,
            last_error, unique_key, unique_for, tags, meta)
        VALUES (
            p_kind, p_payload, 'queued', p_priority, 0, p_max_attempts,
            coalesce(p_run_after, now()), '', '', p_unique_key, p_unique_for, p_tags, p_meta)
        ON CONFLICT (kind, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('queued', 'processing')
        DO NOTHING
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            IF NOT EXISTS (
                SELECT 1 FROM jobs_jobuniquekey AS k
                WHERE k.kind = p_kind AND k.unique_key = p_unique_key
                  AND k.expires_at > clock_timestamp()
            ) THEN
                RETURN QUERY SELECT v_id, true;
                RETURN;
            END IF;
            DELETE FROM jobs_job AS j WHERE j.id = v_id;
        ELSE
            SELECT j.id INTO v_id FROM jobs_job AS j
            WHERE j.kind = p_kind AND j.unique_key = p_unique_key
              AND j.status IN ('queued', 'processing');
            IF FOUND THEN
                RETURN QUERY SELECT v_id, false;
                RETURN;
            END IF;
        END IF;
    END LOOP;
END
$$;
"""
ENQUEUE_UNIQUE_REVERSE = """
DROP FUNCTION jobs_enqueue_unique(text, jsonb, text, interval, integer, integer, timestamptz,
                                  text[], jsonb);
"""


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [("jobs", "0019_periodic_ticks")]

    operations = [
        migrations.CreateModel(
            name="JobPruneRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("ran_at", models.DateTimeField(db_default=Now())),
                ("completed", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("cancelled", models.BigIntegerField(default=0)),
                ("unique_keys", models.BigIntegerField(default=0)),
                ("seconds", models.FloatField(default=0)),
            ],
            options={
                "ordering": ["-ran_at", "-id"],
                "indexes": [models.Index(fields=["ran_at"], name="jobs_jobprunerun_ran_at")],
            },
        ),
        migrations.CreateModel(
            name="JobUniqueKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=100)),
                ("unique_key", models.CharField(max_length=255)),
                ("job_id", models.BigIntegerField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "indexes": [models.Index(fields=["expires_at"], name="jobs_jobuniquekey_expires")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("kind", "unique_key"), name="jobs_jobuniquekey_kind_key"
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="meta",
            field=models.JSONField(blank=True, help_text="A producer's JSON object.", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="tags",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=100), blank=True, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_for",
            field=models.DurationField(
                blank=True, help_text="How long the key stays taken after completion.", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(
                blank=True,
                help_text="While queued or processing, no other job of this kind has this key.",
                max_length=255,
                null=True,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(CHECKS, CHECKS_REVERSE),
                migrations.RunSQL(CHECKS_VALIDATE, migrations.RunSQL.noop),
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=Q(meta__isnull=True)
                        | Exact(
                            Func(
                                F("meta"), function="jsonb_typeof", output_field=models.TextField()
                            ),
                            Value("object"),
                        ),
                        name="jobs_job_meta_is_object",
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=Q(unique_for__isnull=True)
                        | Q(unique_key__isnull=False, unique_for__gt=timedelta(0)),
                        name="jobs_job_unique_for_positive_with_key",
                    ),
                ),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    UNIQUE_INDEX, "DROP INDEX CONCURRENTLY IF EXISTS jobs_job_unique_key"
                )
            ],
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        condition=Q(unique_key__isnull=False, status__in=["queued", "processing"]),
                        fields=("kind", "unique_key"),
                        name="jobs_job_unique_key",
                    ),
                )
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=Q(status="cancelled"),
                fields=["cancelled_at"],
                name="jobs_job_cancelled_at_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=GinIndex(
                condition=Q(tags__isnull=False), fields=["tags"], name="jobs_job_tags_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=GinIndex(
                condition=Q(meta__isnull=False),
                fields=["meta"],
                name="jobs_job_meta_idx",
                opclasses=["jsonb_path_ops"],
            ),
        ),
        migrations.RunSQL(KEY_KEPT, KEY_KEPT_REVERSE),
        migrations.RunSQL(ENQUEUE_UNIQUE, ENQUEUE_UNIQUE_REVERSE),
    ]
