"""When each qcluster schedule last ran, how, when it runs next, and whether it is overdue.

Issue 20: a schedule that stopped running was invisible (the cluster down, its scheduler
dead, every worker stuck). Overdue means no run for two intervals: the last run (the newest
django-q2 task of the schedule's group, which django-q2 sets to the schedule's name) started
more than two intervals ago; a schedule that never ran is overdue one interval after it was
due (its `next_run`), which is two intervals after it was last queued.

A cluster that has just started has not looked at its schedules yet: django-q2's guard calls
its scheduler once it has counted SCHEDULER_PASS_SECONDS of guard cycles (30 s after the
start, then every 30 s). After a restart, a schedule is given that first pass and then its
interval, counted from the start of the oldest live qcluster (issue 36.8: every restart
showed the minute schedules OVERDUE for 30 s). Only the start gives grace: a scheduler that
runs but whose tasks never do keeps moving `next_run` forward, so a grace read from
`next_run` would hide every stuck worker.

Only the task's times and success flag are read: its `result` and arguments are pickles this
worker never loads from a table another role could write.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django_q.models import Schedule, Task

OVERDUE_INTERVALS = 2
# django-q2's Sentinel.guard: `if counter >= 30 and Conf.SCHEDULER: scheduler(…)`, the counter
# adding one guard cycle (Q_CLUSTER's guard_cycle, 0.5 s) a loop; so a first pass 30 s after
# the cluster starts and one every 30 s after (a cycle late at most).
SCHEDULER_PASS_SECONDS = 30

SCHEDULER_PASS = timedelta(seconds=SCHEDULER_PASS_SECONDS)

_INTERVALS = {
    Schedule.HOURLY: timedelta(hours=1),
    Schedule.DAILY: timedelta(days=1),
    Schedule.WEEKLY: timedelta(weeks=1),
    Schedule.BIWEEKLY: timedelta(weeks=2),
}


@dataclass(frozen=True)
class ScheduleRun:
    id: int
    name: str
    func: str
    interval_seconds: float | None  # None: a cadence not judged here (once, cron, monthly)
    last_run_at: datetime | None
    last_run_seconds: float | None
    last_result: str  # "ok", "failed" or "never ran"
    next_run: datetime | None
    overdue: bool
    silent_seconds: float | None  # since the last run (or since it was due, never run)

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        for key in ("last_run_at", "next_run"):
            report[key] = report[key].isoformat() if report[key] else None
        report["every"] = _every(self.interval_seconds)
        return report


def _every(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds % 86400 == 0:
        return f"{seconds / 86400:.0f} d"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:g} min"


def interval_of(schedule: Schedule) -> timedelta | None:
    if schedule.schedule_type == Schedule.MINUTES:
        return timedelta(minutes=schedule.minutes or 1)
    return _INTERVALS.get(schedule.schedule_type)


def schedule_runs(*, now: datetime, cluster_started: datetime | None = None) -> list[ScheduleRun]:
    """Every active schedule (repeats left), by name; two queries whatever the task count.
    `cluster_started`: when the oldest live qcluster started (None: none runs)."""
    schedules = list(Schedule.objects.exclude(repeats=0).order_by("name", "pk"))
    groups = [s.name or str(s.pk) for s in schedules]
    last_runs = {
        row["group"]: row
        for row in Task.objects.filter(group__in=groups)
        .order_by("group", "-started")
        .distinct("group")
        .values("group", "started", "stopped", "success")
    }
    return [_run(s, last_runs.get(s.name or str(s.pk)), now, cluster_started) for s in schedules]


def _run(
    schedule: Schedule, last: dict[str, Any] | None, now: datetime, cluster_started: datetime | None
) -> ScheduleRun:
    interval = interval_of(schedule)
    since = last["started"] if last else schedule.next_run
    silent = (now - since).total_seconds() if since else None
    overdue = False
    if interval is not None and since is not None:
        allowed = interval * (OVERDUE_INTERVALS if last else OVERDUE_INTERVALS - 1)
        due_by = since + allowed
        if cluster_started is not None:  # its first pass, then one interval to run it
            due_by = max(due_by, cluster_started + SCHEDULER_PASS + interval)
        overdue = now > due_by
    return ScheduleRun(
        id=schedule.pk,
        name=schedule.name or schedule.func,
        func=schedule.func,
        interval_seconds=interval.total_seconds() if interval else None,
        last_run_at=last["started"] if last else None,
        last_run_seconds=(last["stopped"] - last["started"]).total_seconds() if last else None,
        last_result=("ok" if last["success"] else "failed") if last else "never ran",
        next_run=schedule.next_run,
        overdue=overdue,
        silent_seconds=round(silent, 1) if silent is not None else None,
    )
