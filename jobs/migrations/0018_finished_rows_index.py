"""The (status, completed_at) index holds finished rows only (issue 36, point 2).

jobs_job_status_done_idx indexed every row: each job wrote three entries into it (queued,
processing, completed, none of them a HOT update since `status` is indexed), and next to a
pinned snapshot it gave the planner a way to scan the queued rows that walks every dead
entry the snapshot keeps (migration 0017). What it serves, pruning and the admin's counts of
finished rows, the partial jobs_job_finished_idx serves the same: a queued row has the claim
and lane indexes, a running one the lease index, a failed one two more.

Built CONCURRENTLY before the old one is dropped CONCURRENTLY (the table stays writable;
this migration is not atomic). The previous release's statements on finished rows plan on
the new index as they did on the old; none of its statements on queued or running rows
needs the old one.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CONCURRENTLY

    dependencies = [("jobs", "0017_claim_scans_stay_on_lanes")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["completed", "failed", "cancelled"])),
                fields=["status", "completed_at"],
                name="jobs_job_finished_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="jobs_job_status_done_idx"),
    ]
