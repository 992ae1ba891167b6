"""One row per tick of a `jobs.periodic` schedule (issue 38, point 4).

The primary key (schedule, tick_at) is what makes a tick enqueue exactly one job across
every qcluster and host: the scheduler inserts the tick's row with ON CONFLICT DO NOTHING and
enqueues the job in the same transaction only when its insert wrote the row. No foreign key
to jobs_job: the row must outlive the pruning of its job, or a pruned tick could fire again.
`job_id` is NULL for a tick skipped because the previous tick's job was still running.

No Django model: nothing but jobs/periodic_scheduler.py reads or writes it, in SQL.
"""

from django.db import migrations

CREATE = """
CREATE TABLE jobs_periodic_tick (
    schedule varchar(200) NOT NULL,
    tick_at timestamptz NOT NULL,
    job_id bigint NULL,
    outcome varchar(20) NOT NULL CHECK (outcome IN ('enqueued', 'overlap')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick_at)
)
"""


class Migration(migrations.Migration):
    dependencies = [("jobs", "0018_finished_rows_index")]

    operations = [migrations.RunSQL(CREATE, "DROP TABLE jobs_periodic_tick")]
