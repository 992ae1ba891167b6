"""When each `jobs.periodic` schedule last ticked, when it ticks next, and whether it is
overdue (issue 38, point 4: the health page and `worker_status` list them beside the
django-q2 schedules).

The schedules are the ones declared in code (`jobs.periodic` at import of a handlers
module); what happened is read from `jobs_periodic_tick`, the table that keys one job per
tick. Overdue: a tick that fell more than GRACE_SECONDS ago has no row, counted from the
schedule's last recorded tick, or, for a schedule that never ticked, from the start of the
oldest live qcluster (a new schedule starts at its next tick, jobs/periodic_scheduler.py).
With no row and no live qcluster nothing is judged here: the processes section says that
no qcluster runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from jobs.periodic_ticks import Periodic, declared, latest_tick, next_tick

# The scheduler's loop sleeps at most 30 s between passes (jobs/periodic_scheduler.py); a
# tick a minute old with no row was missed, not late.
GRACE_SECONDS = 60

_LAST_TICKS_SQL = """
SELECT DISTINCT ON (schedule) schedule, tick_at, outcome, job_id
FROM jobs_periodic_tick WHERE schedule = ANY(%s)
ORDER BY schedule, tick_at DESC
"""


@dataclass(frozen=True)
class PeriodicRun:
    name: str
    kind: str
    every: str  # "cron '0 9 * * 1-5' in Europe/Berlin" or "every 60 s"
    last_tick_at: datetime | None
    last_outcome: str  # "enqueued", "overlap" (skipped: the previous job still ran), "never"
    last_job_id: int | None
    next_tick_at: datetime | None
    overdue: bool
    missed_tick_at: datetime | None  # the latest tick with no row, when overdue

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        for key in ("last_tick_at", "next_tick_at", "missed_tick_at"):
            report[key] = report[key].isoformat() if report[key] else None
        return report


def periodic_runs(*, now: datetime, cluster_started: datetime | None) -> list[PeriodicRun]:
    """Every declared schedule, by name: one query whatever the ticks' count (the primary
    key's order gives each schedule's latest row)."""
    schedules = declared()
    if not schedules:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_LAST_TICKS_SQL, [[s.name for s in schedules]])
        last = {name: (tick, outcome, job) for name, tick, outcome, job in cursor.fetchall()}
    return [_run(s, last.get(s.name), now, cluster_started) for s in schedules]


def _run(
    schedule: Periodic,
    last: tuple[datetime, str, int | None] | None,
    now: datetime,
    cluster_started: datetime | None,
) -> PeriodicRun:
    since = last[0] if last else cluster_started
    expected = latest_tick(schedule, now - timedelta(seconds=GRACE_SECONDS))
    overdue = since is not None and expected is not None and expected > since
    return PeriodicRun(
        name=schedule.name,
        kind=schedule.kind,
        every=schedule.describe(),
        last_tick_at=last[0] if last else None,
        last_outcome=last[1] if last else "never",
        last_job_id=last[2] if last else None,
        next_tick_at=next_tick(schedule, now),
        overdue=overdue,
        missed_tick_at=expected if overdue else None,
    )
