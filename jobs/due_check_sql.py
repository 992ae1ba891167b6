"""The wake-up listener's two statements (jobs/wakeup.py): the due check (`due_now_sql`: is a
job due now, at or above the listener's floor?) and the look-ahead (`LOOK_AHEAD_SQL`: the
first job due within the next LOOK_AHEAD_SECONDS, for a timer). Apart from the listener
because they read the claim index as the claim does (`jobs_first_due_v1`), and the plan
tests read them here (tests/jobs/test_claim_plans.py and the kinds' backlog tests).
"""

from __future__ import annotations

from datetime import datetime

LOOK_AHEAD_SECONDS = 60  # the trigger's horizon: jobs due within it get a timer


def due_now_sql(floor: datetime | None) -> str:
    """The due check: the database's clock and the earliest due job's `run_after` at or
    above `floor` (epoch seconds; NULL when none is due). As the claim reads them
    (`jobs_first_due_v1`, migration 0017): one range of jobs_job_lane_idx per lane (kind,
    priority) that may run, so a paused kind's rows are never read, and the dead entries a
    pinned snapshot keeps below the floor are not walked. The statement is text: the
    listener's asynchronous libpq calls send no parameters, and the floor is a float this
    process formatted."""
    lower = "'-infinity'" if floor is None else f"to_timestamp({floor.timestamp()!r})"
    return f"""
SELECT extract(epoch FROM clock_timestamp()),
    extract(epoch FROM jobs_first_due_v1({lower}, statement_timestamp()))
"""


# The first job due within the look-ahead (after now: what is due now, the due check finds).
LOOK_AHEAD_SQL = f"""
SELECT extract(epoch FROM clock_timestamp()), extract(epoch FROM jobs_first_due_v1(
    statement_timestamp() + interval '1 microsecond',
    statement_timestamp() + make_interval(secs => {LOOK_AHEAD_SECONDS})))
"""
