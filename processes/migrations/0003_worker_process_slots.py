# Issue 37, point 10: a job worker's slots (total and in use per kind) with each beat.
# Nullable: the previous release's INSERT names no such column (I23).
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("processes", "0002_worker_process_plural"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="slots",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
