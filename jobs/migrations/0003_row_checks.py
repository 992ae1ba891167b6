"""Check constraints that refuse, at the INSERT, rows the job loop could never handle (see
Job.Meta). Rows a plain INSERT already left behind are mended first, so the constraints can
be added: an unreadable timestamp is clamped into range (a '-infinity' row becomes due, an
'infinity' one waits as good as forever, as its producer asked), a `processing` row without
a lease gets an expired one (the reaper takes it), and a row that could not run (unknown
status, max_attempts < 1, a payload that is not a JSON object) is failed with the reason in
`last_error`, so worker_status reports it and an operator retries or cancels it.
"""

import datetime
import django.db.models.lookups
from django.db import migrations, models

_LOW, _HIGH = "'0001-01-02 00:00:00+00'", "'9999-12-30 00:00:00+00'"
_KNOWN = "('queued', 'processing', 'completed', 'failed', 'cancelled')"
_FINISHED = "('completed', 'failed', 'cancelled')"
_CANNOT_RUN = f"status NOT IN {_KNOWN} OR max_attempts < 1 OR jsonb_typeof(payload) <> 'object'"

REPAIR = f"""
UPDATE jobs_job SET run_after = LEAST(GREATEST(run_after, {_LOW}), {_HIGH})
WHERE run_after NOT BETWEEN {_LOW} AND {_HIGH};
UPDATE jobs_job SET created_at = LEAST(GREATEST(created_at, {_LOW}), {_HIGH})
WHERE created_at NOT BETWEEN {_LOW} AND {_HIGH};
UPDATE jobs_job SET lease_expires_at = now()
WHERE status = 'processing' AND lease_expires_at IS NULL;
UPDATE jobs_job SET
    status = CASE WHEN status IN {_FINISHED} THEN status ELSE 'failed' END,
    failed_at = CASE WHEN status IN {_FINISHED} THEN failed_at ELSE now() END,
    locked_by = CASE WHEN status IN {_FINISHED} THEN locked_by ELSE '' END,
    lease_expires_at = CASE WHEN status IN {_FINISHED} THEN lease_expires_at ELSE NULL END,
    max_attempts = GREATEST(max_attempts, 1),
    payload = CASE WHEN jsonb_typeof(payload) = 'object' THEN payload
                   ELSE jsonb_build_object('payload', payload) END,
    last_error = 'jobs migration 0003: the row broke a rule the job loop relies on (status '
        || quote_literal(status) || ', max_attempts ' || max_attempts || ', payload a JSON '
        || jsonb_typeof(payload) || '; a payload that is not an object is kept under '
        || '"payload"). Retry or cancel it.' || E'\\n\\n' || last_error
WHERE {_CANNOT_RUN};
"""


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0002_notify_due_trigger'),
    ]

    operations = [
        migrations.RunSQL(REPAIR, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'processing', 'completed', 'failed', 'cancelled'])), name='jobs_job_status_known'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('max_attempts__gte', 1)), name='jobs_job_max_attempts_positive'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status', 'processing'), _negated=True), ('lease_expires_at__isnull', False), _connector='OR'), name='jobs_job_processing_has_lease'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.Exact(models.Func(models.F('payload'), function='jsonb_typeof', output_field=models.TextField()), models.Value('object')), name='jobs_job_payload_is_object'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('run_after__range', (datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc), datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc)))), name='jobs_job_run_after_in_range'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('created_at__range', (datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.timezone.utc), datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.timezone.utc)))), name='jobs_job_created_at_in_range'),
        ),
    ]
