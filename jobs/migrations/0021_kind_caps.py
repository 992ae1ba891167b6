"""A cap per job kind for the whole deployment: its table and the index its count reads
(issue 37, point 2).

`jobs_kindcap` holds `@handler(kind, concurrency=N)` as each worker writes it at start-up
(jobs/kind_caps.py). The claim counts a capped kind's units in use from its processing rows,
never from a counter row that every claim and completion would update (no hot row:
docs/architecture.md); jobs_job_running_kind_idx (`kind WHERE status = 'processing'`) keeps
that count to the kind's running rows, however large its queued backlog or the table.

The index is built CONCURRENTLY (the table stays writable; this migration is not atomic).
The previous release neither reads nor writes the new table.
"""

import django.db.models.functions.datetime
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY

    dependencies = [("jobs", "0020_unique_tags_meta_retention")]

    operations = [
        migrations.CreateModel(
            name="KindCap",
            fields=[
                ("kind", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("concurrency", models.PositiveIntegerField()),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={"ordering": ["kind"]},
        ),
        migrations.AddConstraint(
            model_name="kindcap",
            constraint=models.CheckConstraint(
                condition=models.Q(("concurrency__gte", 1)),
                name="jobs_kindcap_concurrency_positive",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "processing")),
                fields=["kind"],
                name="jobs_job_running_kind_idx",
            ),
        ),
    ]
