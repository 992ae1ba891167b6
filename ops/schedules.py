"""The qcluster's schedules, created by code so nobody edits them by hand in the admin.

`ensure_schedules()` is idempotent: it creates missing schedules, corrects drifted ones
(func, cadence, hook, arguments) by name, and leaves everything else alone.
`disable_unknown_schedules()` stops every other schedule (issue 19: schedules come only from
code; the worker refuses to run what they name anyway, see ops/task_guard.py). Both run from
the `setup_schedules` command and from our `qcluster` wrapper before the cluster starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    func: str  # dotted path of a function taking no arguments
    minutes: int  # cadence; django-q2's scheduler is minute-grained


SCHEDULES: tuple[ScheduleSpec, ...] = (
    ScheduleSpec("jobs: run due jobs", "jobs.tasks.run_due_jobs", 1),
    ScheduleSpec("jobs: reap stale jobs", "jobs.tasks.reap_stale_jobs", 1),
    ScheduleSpec("jobs: prune completed jobs", "jobs.tasks.prune_completed_jobs", 60),
    ScheduleSpec("inbound email: poll", "inbound_email.tasks.poll_inbound_email", 1),
    ScheduleSpec("inbound email: prune old mail", "inbound_email.tasks.prune_inbound_email", 60),
    ScheduleSpec("django-q2: prune task history", "ops.tasks.prune_task_history", 60),
    ScheduleSpec("ops: prune per-kind periods", "ops.tasks.prune_job_periods", 60),
    ScheduleSpec("ops: roll up counters", "ops.tasks.roll_up_counters", 1),
    ScheduleSpec("notifications: new proposal sweep", "notifications.tasks.new_proposal_sweep", 1),
    ScheduleSpec(
        "notifications: proposal review sweep", "notifications.tasks.proposal_review_sweep", 5
    ),
    ScheduleSpec("notifications: digest sweep", "notifications.tasks.digest_sweep", 60),
    ScheduleSpec(
        "notifications: rejection notices", "notifications.tasks.reply_rejected_notices", 1
    ),
)


def ensure_schedules() -> dict[str, int]:
    """Create or correct every schedule in SCHEDULES; return counts of what changed."""
    counts = {"created": 0, "updated": 0, "unchanged": 0}
    with transaction.atomic():
        for spec in SCHEDULES:
            schedule = Schedule.objects.filter(name=spec.name).first()
            if schedule is None:
                Schedule.objects.create(
                    name=spec.name,
                    func=spec.func,
                    schedule_type=Schedule.MINUTES,
                    minutes=spec.minutes,
                    repeats=-1,
                    next_run=timezone.now(),
                )
                counts["created"] += 1
                logger.info("schedule created: %s", spec.name, extra={"action": "schedule_created"})
            elif (
                schedule.func != spec.func
                or schedule.schedule_type != Schedule.MINUTES
                or schedule.minutes != spec.minutes
                or schedule.repeats != -1
                or schedule.hook
                or schedule.args
                or schedule.kwargs
            ):
                schedule.func = spec.func
                schedule.schedule_type = Schedule.MINUTES
                schedule.minutes = spec.minutes
                schedule.repeats = -1
                schedule.hook = None
                schedule.args = None
                schedule.kwargs = None
                schedule.save(
                    update_fields=[
                        "func",
                        "schedule_type",
                        "minutes",
                        "repeats",
                        "hook",
                        "args",
                        "kwargs",
                    ]
                )
                counts["updated"] += 1
                logger.info("schedule updated: %s", spec.name, extra={"action": "schedule_updated"})
            else:
                counts["unchanged"] += 1
    return counts


def disable_unknown_schedules() -> list[Schedule]:
    """Stop every schedule that is not in SCHEDULES (by name); return those it stopped.

    Stopped, not deleted: the row shows an operator what somebody added (repeats=0 is
    django-q2's "never again"). Each is logged at ERROR: something outside this code wrote
    the schedule table.
    """
    ours = {spec.name for spec in SCHEDULES}
    with transaction.atomic():
        unknown = list(
            Schedule.objects.select_for_update().exclude(name__in=ours).exclude(repeats=0)
        )
        for schedule in unknown:
            schedule.repeats = 0
            schedule.save(update_fields=["repeats"])
            logger.error(
                "unknown schedule disabled: %r (func %s)",
                schedule.name,
                schedule.func,
                extra={"action": "schedule_disabled", "schedule": schedule.name},
            )
    return unknown


def disabled_line(schedule: Schedule) -> str:
    """What `setup_schedules` and `qcluster` print for a schedule they disabled."""
    return (
        f"disabled unknown schedule {schedule.name!r} (id {schedule.pk}, func "
        f"{schedule.func}): schedules come only from code (ops/schedules.py)"
    )


def unknown_schedules_enabled() -> list[Schedule]:
    """Schedules not defined in code that django-q2 would still run (repeats != 0)."""
    return list(
        Schedule.objects.exclude(name__in=[spec.name for spec in SCHEDULES])
        .exclude(repeats=0)
        .order_by("id")
    )
