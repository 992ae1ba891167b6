"""The claim's lanes: every (kind, priority) that has a queued job has its `jobs_joblane` row.

The claim asks each lane that may run for its due rows (jobs_runner_step_v5, migration
0016; issue 36, point 1), so a queued row whose lane is missing is never claimed. The jobs
table's trigger writes the lane with the row, whoever inserts it; only a write with the
triggers off skips it (a restore with `--disable-triggers`, a session with
`session_replication_role = replica`). `job_lanes_repair()` finds such lanes, and the
reaper's minute schedule calls it (jobs.tasks.reap_stale_jobs): such a row waits at most
that minute, as a lost wake-up does.
"""

from __future__ import annotations

from django.db import connection

# A loose index scan of jobs_job_lane_idx: one descent per lane that has a queued row (not
# one row read per queued job), each lane's first entry in index order.
_REPAIR_SQL = """
WITH RECURSIVE lanes(kind, negated) AS (
    (SELECT j.kind, j.priority * -1 FROM jobs_job AS j WHERE j.status = 'queued'
     ORDER BY j.kind, j.priority * -1 LIMIT 1)
    UNION ALL
    SELECT next.kind, next.negated FROM lanes CROSS JOIN LATERAL (
        SELECT j.kind, j.priority * -1 AS negated FROM jobs_job AS j
        WHERE j.status = 'queued' AND (j.kind, j.priority * -1) > (lanes.kind, lanes.negated)
        ORDER BY j.kind, j.priority * -1
        LIMIT 1
    ) AS next
)
INSERT INTO jobs_joblane (kind, priority)
SELECT lanes.kind, lanes.negated * -1 FROM lanes
WHERE NOT EXISTS (
    SELECT 1 FROM jobs_joblane AS l
    WHERE l.kind = lanes.kind AND l.priority = lanes.negated * -1
)
"""


def job_lanes_repair() -> int:
    """Write the lane of every queued row that has none; return how many were missing."""
    with connection.cursor() as cursor:
        cursor.execute(_REPAIR_SQL)
        return cursor.rowcount
