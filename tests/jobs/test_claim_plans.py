"""Issue 36, point 2: the statements on the claim's path stay on the lane index next to a
pinned snapshot.

While a snapshot is held, every job claimed leaves a dead entry in the lane index
(jobs_job_lane_idx) that nothing can remove, so the index grows by pages while ANALYZE
counts only its few live rows. An index on (status, completed_at) that also held the
'queued' entries then looked cheaper to the planner: once autovacuum's ANALYZE ran under the
pin (about 90 s into bench/hot_rows.py), the claim's generic plan and the listener's checks
switched to it and walked every 'queued' entry the pin keeps, dead or not, at every call (a
runner call went from 2 to 20-30 ms and grew with the pin's age). The index on finished rows
holds only finished rows (migration jobs/0017), so no index but the lane index can serve a
scan of queued rows by lane.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from jobs import selectors
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from tests.support.plans import explained, runner_step_buffers
from tests.support.wakeup import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 40  # of CHURN jobs each, queued, claimed and completed under the pin
CHURN = 1000

_CHURN_SQL = """
WITH queued AS (
    INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                          created_at, locked_by, last_error)
    SELECT 'tests.noop', '{}', 'queued', 0, 0, 3, clock_timestamp() - interval '10 minutes',
           now(), '', ''
    FROM generate_series(1, %s)
    RETURNING id
)
SELECT array_agg(id) FROM queued
"""


def _churn_under_a_pin() -> None:
    """What a busy qcluster leaves while a snapshot is held: jobs queued, claimed and
    completed, each of its three versions kept."""
    with connection.cursor() as cursor:
        for _ in range(ROUNDS):
            cursor.execute(_CHURN_SQL, [CHURN])
            (ids,) = cursor.fetchone()
            cursor.execute(
                "UPDATE jobs_job SET status = 'processing', attempts = 1, locked_by = 'w', "
                "lease_expires_at = now() + interval '1 minute' WHERE id = ANY(%s)",
                [ids],
            )
            cursor.execute(
                "UPDATE jobs_job SET status = 'completed', completed_at = now(), "
                "lease_expires_at = NULL, locked_by = '' WHERE id = ANY(%s)",
                [ids],
            )


def test_the_claims_scans_stay_on_the_lane_index_next_to_a_pinned_snapshot():
    """40,000 jobs run under a pinned snapshot, then ANALYZE (autovacuum's, under the pin):
    the runner's floored claim, the listener's floored due check and look-ahead, and the
    linger poll each read a handful of buffers, not the 40,000 dead 'queued' entries."""
    with raw_connection() as pin:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM jobs_job").fetchone()
        try:
            _churn_under_a_pin()
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE jobs_job")
                cursor.execute(
                    "INSERT INTO jobs_job (kind, payload, status, priority, attempts, "
                    "max_attempts, run_after, created_at, locked_by, last_error) "
                    "SELECT 'tests.noop', '{}', 'queued', 0, 0, 3, now(), now(), '', '' "
                    "FROM generate_series(1, 3) RETURNING run_after"
                )
                due = cursor.fetchall()[0][0]
                cursor.execute("SELECT now()")
                (now,) = cursor.fetchone()
            floor = due - timedelta(seconds=1)  # as a busy drain's floor: just below the due
            checks = {
                "listener due check (floored)": (due_now_sql(floor), None),
                "listener look-ahead": (LOOK_AHEAD_SQL, None),
                "linger poll (floored)": (selectors._LINGER_SQL, [now, floor]),
            }
            for sql, params in checks.values():  # planned once, as in a long-lived session
                explained(sql, params)
            costs = {name: explained(sql, params) for name, (sql, params) in checks.items()}
            costs["runner claim (floored)"], step, plans = runner_step_buffers(floor=floor)
        finally:
            pin.rollback()
    print("buffers per scan next to 40,000 pinned dead entries:", costs)
    assert len(step.claimed) == 3  # the claim measured is the one that found the due jobs
    # A scan that walks the pinned 'queued' entries reads hundreds of index pages at least
    # (200-450 on the code before migration 0017); one that reads the lane's range, a few
    # (the claim's count includes writing the three rows it claims).
    assert all(buffers < 100 for buffers in costs.values()), costs
    # Sorts priced out make every plan's cost 10^10: far above `jit_above_cost`, so the
    # functions turn JIT off, or each call would compile its plan (2 s a call).
    assert not [plan for plan in plans if "JIT:" in plan], plans
