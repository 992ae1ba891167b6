"""What an operator needs to see at a glance, read from every app's tables.

Only reads (selectors). `worker_status` prints it; `needs_operator` lists the findings that
should page somebody, which the command turns into a non-zero exit code for monitoring.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from canonical_ids.models import WriterSlotLease
from inbound_email.models import InboundEmail, Reply
from jobs.models import Job
from notifications.models import EmailNotification

# A due job that has waited longer than this means the runner is not keeping up (seconds).
BACKLOG_ALERT_SECONDS = 300
# A mail awaiting its instruction relay this long means the relay is stuck (retries spent
# their budget long before, or the relay jobs do not run).
RELAY_STUCK_ALERT = timedelta(hours=24)


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
    leases: list[dict[str, Any]] = field(default_factory=list)
    needs_operator: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counts(queryset, key: str) -> dict[str, int]:
    return {
        row[key]: row["n"] for row in queryset.values(key).annotate(n=Count("id")).order_by(key)
    }


def database_info() -> dict[str, Any]:
    """Which database this process uses: engine, server version, where (no password), and
    whether it is the embedded server under WORKER_VAR_DIR/pg."""
    params = connection.settings_dict
    host = params.get("HOST") or "localhost"
    where = host if host.startswith("/") else f"{host}:{params.get('PORT') or 5432}"
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    return {
        "engine": connection.vendor,
        "server_version": version,
        "embedded": settings.DB_IS_EMBEDDED,
        "where": f"{where}/{params['NAME']}",
    }


def worker_status() -> WorkerStatus:
    now = timezone.now()
    status = WorkerStatus(database=database_info())

    status.jobs_by_status = _counts(Job.objects.all(), "status")
    for row in Job.objects.values("kind", "status").annotate(n=Count("id")).order_by("kind"):
        status.jobs_by_kind.setdefault(row["kind"], {})[row["status"]] = row["n"]
    due = Job.objects.filter(status=Job.Status.QUEUED, run_after__lte=now)
    oldest = due.order_by("run_after", "id").values("id", "kind", "run_after").first()
    if oldest:
        waited = (now - oldest["run_after"]).total_seconds()
        status.oldest_due_job = {
            "id": oldest["id"],
            "kind": oldest["kind"],
            "due_since": oldest["run_after"].isoformat(),
            "waiting_seconds": round(waited, 1),
        }
        if waited > BACKLOG_ALERT_SECONDS:
            status.needs_operator.append(
                f"job #{oldest['id']} ({oldest['kind']}) has been due for {waited:.0f}s: "
                "is the qcluster running?"
            )
    stuck = Job.objects.filter(status=Job.Status.PROCESSING, lease_expires_at__lt=now)
    status.stuck_jobs = [
        {
            "id": row["id"],
            "kind": row["kind"],
            "locked_by": row["locked_by"],
            "lease_expired_at": row["lease_expires_at"].isoformat(),
        }
        for row in stuck.order_by("lease_expires_at").values(
            "id", "kind", "locked_by", "lease_expires_at"
        )[:50]
    ]
    if status.stuck_jobs:
        status.needs_operator.append(
            f"{stuck.count()} job(s) stuck in processing past their lease: run "
            "`manage.py reap_stale` (or check that the reaper schedule runs)"
        )
    failed_jobs = status.jobs_by_status.get(Job.Status.FAILED, 0)
    if failed_jobs:
        status.needs_operator.append(
            f"{failed_jobs} job(s) failed permanently: retry or cancel them in the admin"
        )

    status.inbound_by_status = _counts(InboundEmail.objects.all(), "status")
    status.quarantined_mail = status.inbound_by_status.get(InboundEmail.Status.QUARANTINED, 0)
    if status.quarantined_mail:
        status.needs_operator.append(
            f"{status.quarantined_mail} quarantined mail(s): view, reprocess or discard them "
            "in the admin"
        )
    status.instructions_needing_operator = Reply.objects.filter(
        needs_operator=True, operator_acknowledged_at__isnull=True
    ).count()
    if status.instructions_needing_operator:
        status.needs_operator.append(
            f"{status.instructions_needing_operator} PI instruction(s) could not be posted to "
            "Slack and wait in the database inbox: handle them, then acknowledge them in the "
            "admin (Replies)"
        )
    status.instruction_relays_stuck = InboundEmail.objects.filter(
        status=InboundEmail.Status.AWAITING_RELAY, updated_at__lt=now - RELAY_STUCK_ALERT
    ).count()
    if status.instruction_relays_stuck:
        status.needs_operator.append(
            f"{status.instruction_relays_stuck} instruction relay(s) stuck: mail awaiting "
            f"relay for over {RELAY_STUCK_ALERT.total_seconds() / 3600:.0f} h (check the "
            "relay jobs and the pending Replies in the admin)"
        )

    status.notifications_by_status = _counts(EmailNotification.objects.all(), "status")
    claim_timeout = timedelta(seconds=settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS)
    status.notifications_stuck_sending = EmailNotification.objects.filter(
        status=EmailNotification.Status.SENDING, claimed_at__lt=now - claim_timeout
    ).count()
    if status.notifications_stuck_sending:
        status.needs_operator.append(
            f"{status.notifications_stuck_sending} notification(s) stuck in sending: "
            "is the sweep schedule running?"
        )

    status.leases = [
        {
            "slot": lease.slot,
            "role": lease.role,
            "holder": f"{lease.holder_host}:{lease.holder_pid}",
            "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at else None,
            "expires_at": lease.expires_at.isoformat(),
        }
        for lease in WriterSlotLease.objects.filter(expires_at__gt=now).order_by("slot")
    ]
    return status
