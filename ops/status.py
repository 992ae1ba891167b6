"""What an operator needs to see at a glance, read from every app's selectors.

Only reads, and no rule of its own about what a row's state means: "stuck", "due", "stale
sending", "needs an operator" are each decided once in the owning app's selectors module.
What is decided here is the alert policy: which findings page somebody. `worker_status`
prints it, the admin's health page shows it, `/metrics` exports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from canonical_ids.selectors import leases_live
from inbound_email.models import InboundEmail
from inbound_email.selectors import (
    RELAY_STUCK_AFTER,
    inbound_relays_stuck,
    inbound_status_counts,
    replies_needing_operator,
)
from jobs.models import Job, PausedKind
from jobs.selectors import (
    job_counts_by_kind,
    job_kind_caps,
    job_kind_rates,
    job_oldest_due,
    job_status_counts,
    jobs_stuck,
)
from jobs.stops import job_stop_counts
from notifications.selectors import (
    feedback_last_24_hours,
    notification_status_counts,
    notifications_stuck_sending,
    sending_pause,
)
from ops.conf import get_config
from ops.durations import humanize_seconds
from ops.periodic_status import periodic_runs
from ops.schedule_status import schedule_runs
from ops.schedules import unknown_schedules_enabled
from ops.selectors import (
    OpenTransaction,
    database_clock_and_oldest_transaction,
    tasks_refused,
)
from processes.models import WorkerProcess
from processes.selectors import processes_listed

# A due job that has waited longer than this means the runner is not keeping up (seconds).
BACKLOG_ALERT_SECONDS = 300
# SES puts an account under review at these rates; below FEEDBACK_MIN_SENT mails a day the
# rate is too noisy to page anyone.
SES_BOUNCE_REVIEW_RATE = 0.05
SES_COMPLAINT_REVIEW_RATE = 0.001
FEEDBACK_MIN_SENT = 100
# Stuck rows listed in full (the count covers them all).
STUCK_JOBS_LISTED = 50


@dataclass
class WorkerStatus:
    database: dict[str, Any] = field(default_factory=dict)
    jobs_by_status: dict[str, int] = field(default_factory=dict)
    jobs_by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    oldest_due_job: dict[str, Any] | None = None
    stuck_jobs: list[dict[str, Any]] = field(default_factory=list)
    inbound_by_status: dict[str, int] = field(default_factory=dict)
    quarantined_mail: int = 0
    instructions_needing_operator: int = 0
    instruction_relays_stuck: int = 0
    notifications_by_status: dict[str, int] = field(default_factory=dict)
    notifications_stuck_sending: int = 0
    # All sending paused for SES's daily quota (issue 23): paused_until, reason, max_send_rate.
    sending: dict[str, Any] = field(default_factory=dict)
    # Bounces and complaints of the last 24 h and their rates (issue 23).
    mail_feedback: dict[str, float] = field(default_factory=dict)
    leases: list[dict[str, Any]] = field(default_factory=list)
    # Issue 19: tasks the worker refused to run, and schedules not defined in code.
    tasks_refused: int = 0
    last_refused_task: dict[str, Any] | None = None
    unknown_schedules: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)  # live, then recently gone
    schedules: list[dict[str, Any]] = field(default_factory=list)  # ops.schedule_status
    periodic: list[dict[str, Any]] = field(default_factory=list)  # ops.periodic_status
    paused_kinds: list[dict[str, Any]] = field(default_factory=list)  # not claimed until resumed
    # Issue 37: each capped kind's cap (`@handler(kind, concurrency=N)`) and units in use.
    kind_caps: list[dict[str, Any]] = field(default_factory=list)
    # Issue 38: each rate-limited kind's rate (`@handler(kind, rate="20/s")`) and next token.
    kind_rates: list[dict[str, Any]] = field(default_factory=list)
    # Issue 37, point 10: per kind, the jobs timed out and cancelled while running in the
    # last hour ({kind: {"timeout": n, "cancel": n}}, jobs.stops.job_stop_counts).
    jobs_stopped_last_hour: dict[str, dict[str, int]] = field(default_factory=dict)
    # Issue 32: the oldest transaction another session keeps open (pg_stat_activity); while
    # it holds a snapshot no dead row version can be removed anywhere in the database.
    oldest_transaction: dict[str, Any] | None = None
    needs_operator: list[str] = field(default_factory=list)
    # Not part of the report (as_dict): the total behind the listed stuck rows, and the moment
    # every figure was read at, for the views that show more than the command prints.
    stuck_jobs_total: int = field(default=0, repr=False)
    now: datetime | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        del report["stuck_jobs_total"], report["now"]
        return report


def worker_status(*, now: datetime | None = None) -> WorkerStatus:
    """The operator's view; every "stuck", "live" and "due" is judged at `now`, by default
    the database's time (several hosts look, and a host's clock may be minutes off)."""
    database, db_time, oldest = _database_and_time()
    now = now or db_time
    status = WorkerStatus(now=now, database=database)
    _oldest_transaction(status, oldest, now)
    _jobs(status, now)
    _inbound(status, now)
    _notifications(status, now)
    _task_guard(status)
    status.leases = [
        {
            "slot": lease.slot,
            "role": lease.role,
            "holder": f"{lease.holder_host}:{lease.holder_pid}",
            "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at else None,
            "expires_at": lease.expires_at.isoformat(),
        }
        for lease in leases_live(now=now)
    ]
    status.processes = _processes()
    _schedules(status, now)
    return status


def _periodic(status: WorkerStatus, now: datetime, cluster_started: datetime | None) -> None:
    runs = periodic_runs(now=now, cluster_started=cluster_started)
    status.periodic = [run.as_dict() for run in runs]
    for run in runs:
        if run.overdue and run.missed_tick_at is not None:
            status.needs_operator.append(
                f"periodic job {run.name!r} ({run.every}) missed its tick of "
                f"{run.missed_tick_at:%Y-%m-%d %H:%M:%S} UTC: is a qcluster running its "
                "scheduler (the log's `periodic scheduler` lines)?"
            )


def _schedules(status: WorkerStatus, now: datetime) -> None:
    # The oldest live qcluster's start: a restarted cluster's scheduler has not passed yet.
    starts = [
        datetime.fromisoformat(p["started_at"])
        for p in status.processes
        if p["role"] == WorkerProcess.Role.QCLUSTER and p["state"] == "live"
    ]
    runs = schedule_runs(now=now, cluster_started=min(starts, default=None))
    _periodic(status, now, min(starts, default=None))
    status.schedules = [run.as_dict() for run in runs]
    for run in runs:
        if run.overdue:
            what = "has not run" if run.last_run_at else "never ran since it was due"
            status.needs_operator.append(
                f"schedule {run.name!r} {what} for {humanize_seconds(run.silent_seconds or 0)} "
                f"(every {run.as_dict()['every']}): is the qcluster running?"
            )


def _processes() -> list[dict[str, Any]]:
    """Live processes and those gone within the last hour (processes.selectors), each with
    its state: live, stopped (a clean stop) or gone (silent for 3 beats: killed, host lost)."""
    return [
        {
            "id": row.pk,
            "role": row.role,
            "host": row.host,
            "pid": row.pid,
            "version": row.version,
            "state": "live" if row.live else ("stopped" if row.stopped_at else "gone"),
            "started_at": row.started_at.isoformat(),
            "heartbeat_at": row.heartbeat_at.isoformat(),
            "current": row.current,
            # A job worker's slots as of its last beat (issue 37, point 10), else None.
            "slots": _slots(row.slots) if row.live else None,
        }
        for row in processes_listed()
    ]


def _slots(slots: Any) -> dict[str, Any] | None:
    """A beat's slots figure, with its total in use; None when the process reported none
    (not a job worker, or a release before issue 37's point 10)."""
    if not isinstance(slots, dict):
        return None
    busy = {str(k): int(n) for k, n in (slots.get("busy") or {}).items()}
    figure = {
        "threads": int(slots.get("threads") or 0),
        "async": int(slots.get("async") or 0),
        "busy": busy,
        "in_use": sum(busy.values()),
    }
    figure["text"] = slots_line(figure)
    return figure


def slots_line(slots: dict[str, Any]) -> str:
    """`3 of 10 + 500 in use (a.kind 2, b.kind 1)`: in use of thread + async slots."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in slots["busy"].items())
    return f"{slots['in_use']} of {slots['threads']} + {slots['async']} in use" + (
        f" ({kinds})" if kinds else ""
    )


def slots_by_kind(processes: list[dict[str, Any]]) -> dict[str, int]:
    """Slots in use per kind over the live processes (their last beats)."""
    total: dict[str, int] = {}
    for process in processes:
        for kind, n in ((process.get("slots") or {}).get("busy") or {}).items():
            total[kind] = total.get(kind, 0) + n
    return dict(sorted(total.items()))


def database_info() -> dict[str, Any]:
    """Which database this process uses: engine, server version, where (no password), and
    whether it is the embedded server under WORKER_VAR_DIR/pg."""
    return _database_and_time()[0]


def _database_and_time() -> tuple[dict[str, Any], datetime, OpenTransaction | None]:
    """database_info(), the database's clock and the oldest open transaction, read by one
    statement."""
    params = connection.settings_dict
    host = params.get("HOST") or "localhost"
    where = host if host.startswith("/") else f"{host}:{params.get('PORT') or 5432}"
    version, db_time, oldest = database_clock_and_oldest_transaction()
    return (
        {
            "engine": connection.vendor,
            "server_version": version,
            "embedded": get_config().db_is_embedded,
            "where": f"{where}/{params['NAME']}",
        },
        db_time,
        oldest,
    )


def _oldest_transaction(
    status: WorkerStatus, oldest: OpenTransaction | None, now: datetime
) -> None:
    if oldest is None:
        return
    age = max((now - oldest.xact_start).total_seconds(), 0.0)
    status.oldest_transaction = {
        "pid": oldest.pid,
        "application_name": oldest.application_name,
        "client_addr": oldest.client_addr,
        "xact_start": oldest.xact_start.isoformat(),
        "query_start": oldest.query_start.isoformat() if oldest.query_start else None,
        "state": oldest.state,
        "holds_snapshot": oldest.holds_snapshot,
        "age_seconds": round(age, 1),
    }
    if age > get_config().long_transaction_alert_seconds:
        status.needs_operator.append(
            f"a transaction has been open for {humanize_seconds(age)} on the database: "
            f"{describe_session(status.oldest_transaction)}; while it lasts PostgreSQL removes "
            "no dead row anywhere and enqueues slow down: end it (COMMIT / ROLLBACK, or "
            f"SELECT pg_terminate_backend({oldest.pid})) if nobody needs it"
        )


def describe_session(oldest: dict[str, Any]) -> str:
    """Which session it is, in the words an operator searches for."""
    app = oldest["application_name"] or "(no application name)"
    client = oldest["client_addr"] or "a local socket"
    query = (oldest["query_start"] or "—")[:19].replace("T", " ")
    return (
        f"{app} from {client}, pid {oldest['pid']}, {oldest['state'] or '?'}, "
        f"last query started {query} UTC"
    )


def _jobs(status: WorkerStatus, now: datetime) -> None:
    status.jobs_by_status = {key: n for key, n in sorted(job_status_counts().items()) if n}
    status.jobs_by_kind = job_counts_by_kind()
    status.paused_kinds = [
        {"kind": p.kind, "paused_at": p.paused_at.isoformat(), "paused_by": p.paused_by}
        for p in PausedKind.objects.order_by("kind")
    ]
    status.kind_caps = job_kind_caps()
    status.kind_rates = job_kind_rates()
    status.jobs_stopped_last_hour = job_stop_counts(now=now)
    oldest = job_oldest_due(now=now)
    if oldest:
        waited = (now - oldest.run_after).total_seconds()
        status.oldest_due_job = {
            "id": oldest.pk,
            "kind": oldest.kind,
            "due_since": oldest.run_after.isoformat(),
            "waiting_seconds": round(waited, 1),
        }
        if waited > BACKLOG_ALERT_SECONDS:
            status.needs_operator.append(
                f"job #{oldest.pk} ({oldest.kind}) has been due for {humanize_seconds(waited)}: "
                "is the qcluster running?"
            )
    stuck = jobs_stuck(now=now)
    status.stuck_jobs = [
        {
            "id": row["id"],
            "kind": row["kind"],
            "locked_by": row["locked_by"],
            "lease_expired_at": row["lease_expires_at"].isoformat(),
        }
        for row in stuck.order_by("lease_expires_at").values(
            "id", "kind", "locked_by", "lease_expires_at"
        )[:STUCK_JOBS_LISTED]
    ]
    if status.stuck_jobs:
        status.stuck_jobs_total = stuck.count()
        status.needs_operator.append(
            f"{status.stuck_jobs_total} job(s) stuck in processing past their lease: run "
            "`manage.py reap_stale` (or check that the reaper schedule runs)"
        )
    failed_jobs = status.jobs_by_status.get(Job.Status.FAILED, 0)
    if failed_jobs:
        status.needs_operator.append(
            f"{failed_jobs} job(s) failed permanently: retry or cancel them in the admin"
        )


def _inbound(status: WorkerStatus, now: datetime) -> None:
    status.inbound_by_status = inbound_status_counts()
    status.quarantined_mail = status.inbound_by_status.get(InboundEmail.Status.QUARANTINED, 0)
    if status.quarantined_mail:
        status.needs_operator.append(
            f"{status.quarantined_mail} quarantined mail(s): view, reprocess or discard them "
            "in the admin"
        )
    status.instructions_needing_operator = replies_needing_operator().count()
    if status.instructions_needing_operator:
        status.needs_operator.append(
            f"{status.instructions_needing_operator} PI instruction(s) could not be posted to "
            "Slack and wait in the database inbox: handle them, then acknowledge them in the "
            "admin (Replies)"
        )
    status.instruction_relays_stuck = inbound_relays_stuck(now=now).count()
    if status.instruction_relays_stuck:
        status.needs_operator.append(
            f"{status.instruction_relays_stuck} instruction relay(s) stuck: mail awaiting "
            f"relay for over {RELAY_STUCK_AFTER.total_seconds() / 3600:.0f} h (check the "
            "relay jobs and the pending Replies in the admin)"
        )


def _notifications(status: WorkerStatus, now: datetime) -> None:
    status.notifications_by_status = notification_status_counts()
    status.notifications_stuck_sending = notifications_stuck_sending(now=now).count()
    status.sending = sending_pause(now=now)
    feedback = status.mail_feedback = feedback_last_24_hours(now=now)
    if feedback["sent"] >= FEEDBACK_MIN_SENT and (
        feedback["bounce_rate"] >= SES_BOUNCE_REVIEW_RATE
        or feedback["complaint_rate"] >= SES_COMPLAINT_REVIEW_RATE
    ):
        status.needs_operator.append(
            f"bounce rate {feedback['bounce_rate']:.1%} / complaint rate "
            f"{feedback['complaint_rate']:.2%} over the last 24 h: SES reviews an account at "
            f"{SES_BOUNCE_REVIEW_RATE:.0%} / {SES_COMPLAINT_REVIEW_RATE:.1%} (check the "
            "suppression list and where the addresses come from)"
        )
    if status.notifications_stuck_sending:
        status.needs_operator.append(
            f"{status.notifications_stuck_sending} notification(s) stuck in sending: "
            "is the sweep schedule running?"
        )


def _task_guard(status: WorkerStatus) -> None:
    refused = tasks_refused()
    status.tasks_refused = refused.count()
    if status.tasks_refused:
        last = refused.order_by("-refused_at", "-id").first()
        status.last_refused_task = {
            "func": last.func,
            "source": last.source,
            "schedule": last.group,
            "refused_at": last.refused_at.isoformat(),
            "reason": last.reason,
        }
        status.needs_operator.append(
            f"{status.tasks_refused} task(s) refused: they named a function the worker does "
            f"not run (last: {last.func or '?'}, {last.reason}); find who wrote them, then "
            "delete them in the admin (Refused tasks)"
        )
    status.unknown_schedules = [
        {"id": schedule.pk, "name": schedule.name, "func": schedule.func}
        for schedule in unknown_schedules_enabled()
    ]
    for schedule in status.unknown_schedules:
        status.needs_operator.append(
            f"schedule {schedule['name']!r} (func {schedule['func']}) is not defined in code: "
            "the worker refuses its tasks; run `manage.py setup_schedules` to disable it"
        )
