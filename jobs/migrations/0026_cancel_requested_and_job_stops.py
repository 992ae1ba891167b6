"""Cancelling a running job, and the record of stopped jobs (issue 37, points 6, 8, 10).

`Job.cancel_requested_at`: nullable, no default, so adding it rewrites nothing and takes the
table's lock for an instant. The previous release neither reads nor writes it: its Cancel
leaves running jobs alone, as before, and its workers never see a request (I23).
`JobStop`: one row per timed-out or cancelled attempt, counted per kind over the last hour
through its `at` index.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0025_kind_rates")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="JobStop",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("attempt", models.PositiveIntegerField()),
                ("kind", models.CharField(max_length=100)),
                (
                    "reason",
                    models.CharField(
                        choices=[("timeout", "Timed out"), ("cancel", "Cancelled while running")],
                        max_length=10,
                    ),
                ),
                ("at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "indexes": [models.Index(fields=["at"], name="jobs_jobstop_at_idx")],
            },
        ),
    ]
