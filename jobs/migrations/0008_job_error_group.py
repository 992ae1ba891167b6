# Issue 20: the "failed jobs by error" page and its filter read a stored key (bench/console.py:
# grouping a million-row table by a regexp of last_error on every request cost ~0.5 s).

from django.db import migrations, models

# The group of a failure: its kind, exception class and normalised message (numbers N, long hex
# runs X, quoted text '…'), as the first line of last_error says ("Class: message", as
# services.format_error writes it). One definition, in the database: the trigger below keys
# rows with it and jobs.error_groups shows a group's class and message with it.
#
# Why a BEFORE trigger and not a STORED generated column: a generated column is recomputed on
# every UPDATE of the row (claim, heartbeat, completion: the job loop's hot path), and adding
# one rewrites the whole table under an exclusive lock. The trigger runs its function only
# when a row is (or stays) failed and its status, kind, error or key is written; the WHEN test
# on other writes is a comparison. It is a trigger rather than a value written by
# services.job_fail because another producer's plain SQL may fail or rewrite rows too, and
# the key must be the database's own, whatever the writer put in the column.
FUNCTIONS = r"""
CREATE FUNCTION jobs_error_class(last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(split_part(split_part(last_error, E'\n', 1), ':', 1), 200)
$$;

CREATE FUNCTION jobs_error_message(last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(regexp_replace(regexp_replace(regexp_replace(
        btrim(substr(first_line, length(split_part(first_line, ':', 1)) + 2)),
        '[0-9a-fA-F]{8,}', 'X', 'g'), '[0-9]+', 'N', 'g'),
        '''[^'']*''|"[^"]*"', '''…''', 'g'), 300)
    FROM (SELECT split_part(last_error, E'\n', 1) AS first_line) AS s
$$;

CREATE FUNCTION jobs_error_group(kind text, last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(coalesce(kind, '') || E'\x1f' || jobs_error_class(coalesce(last_error, ''))
               || E'\x1f' || jobs_error_message(coalesce(last_error, '')))
$$;

CREATE FUNCTION jobs_error_group_set() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.error_group := jobs_error_group(NEW.kind, NEW.last_error);
    RETURN NEW;
END $$;

UPDATE jobs_job SET error_group = jobs_error_group(kind, last_error) WHERE status = 'failed';

CREATE TRIGGER jobs_error_group_insert BEFORE INSERT ON jobs_job
    FOR EACH ROW WHEN (NEW.status = 'failed') EXECUTE FUNCTION jobs_error_group_set();
CREATE TRIGGER jobs_error_group_update
    BEFORE UPDATE OF status, kind, last_error, error_group ON jobs_job
    FOR EACH ROW WHEN (NEW.status = 'failed') EXECUTE FUNCTION jobs_error_group_set();
"""

REVERSE = """
DROP TRIGGER IF EXISTS jobs_error_group_insert ON jobs_job;
DROP TRIGGER IF EXISTS jobs_error_group_update ON jobs_job;
DROP FUNCTION IF EXISTS jobs_error_group_set();
DROP FUNCTION IF EXISTS jobs_error_group(text, text);
DROP FUNCTION IF EXISTS jobs_error_message(text);
DROP FUNCTION IF EXISTS jobs_error_class(text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_job_counts"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="error_group",
            field=models.CharField(
                blank=True,
                db_default="",
                editable=False,
                help_text="While failed: md5 of kind, exception class and normalised message "
                "(set by the database, migration 0008).",
                max_length=32,
            ),
        ),
        migrations.RunSQL(FUNCTIONS, REVERSE),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["error_group", "failed_at"],
                include=["id"],
                name="jobs_job_error_group_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "failed")),
                fields=["failed_at"],
                name="jobs_job_failed_at_idx",
            ),
        ),
    ]
