"""worker_status's figures as Prometheus metrics, read from the database at scrape time.

A custom collector on a registry of its own per scrape: the figures are table counts, not
per-process counters, so every web worker answers the same and nothing is kept in memory
between scrapes (no multiprocess mode needed under gunicorn).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from inbound_email.models import InboundEmail
from jobs.models import Job
from notifications.models import EmailNotification
from ops.labels import bounded, fold, job_kinds
from ops.rates import rate_metrics
from ops.status import WorkerStatus, slots_by_kind, worker_status


class WorkerStatusCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from status_metrics(worker_status())
        yield from rate_metrics()  # counters and histograms kept by triggers (ops/rates.py)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def status_metrics(status: WorkerStatus) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "worker_jobs", "Job rows by kind and status.", labels=["kind", "status"]
    )
    # Labels from bounded sets (ops/labels.py): a kind without a handler in code, or a status
    # outside the model's choices, is counted as "other".
    known_kinds = job_kinds()
    by_labels: dict[tuple[str, str], int] = {}
    for kind, counts in status.jobs_by_kind.items():
        for state, n in counts.items():
            key = (bounded(kind, known_kinds), bounded(state, Job.Status.values))
            by_labels[key] = by_labels.get(key, 0) + n
    for (kind, state), n in sorted(by_labels.items()):
        jobs.add_metric([kind, state], n)
    yield jobs
    # Issue 37: each capped kind's cap and its units in use (capped kinds have handlers, so
    # the kind label stays in the bounded set).
    caps = GaugeMetricFamily(
        "worker_job_kind_cap",
        "The most jobs of a kind processing at once (@handler concurrency=).",
        labels=["kind"],
    )
    running = GaugeMetricFamily(
        "worker_job_kind_cap_running",
        "Jobs of a capped kind processing now (its units in use).",
        labels=["kind"],
    )
    for cap in status.kind_caps:
        kind = bounded(cap["kind"], known_kinds)
        caps.add_metric([kind], cap["concurrency"])
        running.add_metric([kind], cap["running"])
    yield caps
    yield running
    # Issue 38: each rate-limited kind's rate, in jobs a second.
    rates = GaugeMetricFamily(
        "worker_job_kind_rate_per_second",
        "The most jobs of a kind started a second (@handler rate=), whatever its unit.",
        labels=["kind"],
    )
    for rate in status.kind_rates:
        rates.add_metric([bounded(rate["kind"], known_kinds)], rate["per_second"])
    yield rates
    # Issue 37, point 10: slots in use per kind over the live processes' last beats (kind
    # from the bounded set), and the slots those processes have (labels: thread, async).
    in_use = GaugeMetricFamily(
        "worker_job_slots_in_use",
        "Job slots in use now (running, or holding a completion until it is flushed), by "
        "kind, summed over the live worker processes' last beats.",
        labels=["kind"],
    )
    by_kind: dict[str, int] = {}
    for kind, n in slots_by_kind(status.processes).items():
        label = bounded(kind, known_kinds)
        by_kind[label] = by_kind.get(label, 0) + n
    for kind, n in sorted(by_kind.items()):
        in_use.add_metric([kind], n)
    yield in_use
    slots = GaugeMetricFamily(
        "worker_job_slots",
        "Job slots of the live worker processes (JOBS_CONCURRENCY threads and "
        "JOBS_ASYNC_CONCURRENCY event loop tasks each), by kind of slot.",
        labels=["pool"],
    )
    figures = [p["slots"] for p in status.processes if p["state"] == "live" and p.get("slots")]
    slots.add_metric(["thread"], sum(f["threads"] for f in figures))
    slots.add_metric(["async"], sum(f["async"] for f in figures))
    yield slots
    # Issue 37, point 10: jobs stopped while running in the last hour (jobs.stops), per kind.
    timeouts = GaugeMetricFamily(
        "worker_job_timeouts_last_hour",
        "Jobs whose handler ran past its timeout (@handler timeout=) in the last hour.",
        labels=["kind"],
    )
    cancels = GaugeMetricFamily(
        "worker_job_cancellations_last_hour",
        "Jobs cancelled by an operator while running, in the last hour.",
        labels=["kind"],
    )
    stopped: dict[str, dict[str, int]] = {}
    for kind, counts in status.jobs_stopped_last_hour.items():
        into = stopped.setdefault(bounded(kind, known_kinds), {"timeout": 0, "cancel": 0})
        into["timeout"] += counts["timeout"]
        into["cancel"] += counts["cancel"]
    for kind, counts in sorted(stopped.items()):
        timeouts.add_metric([kind], counts["timeout"])
        cancels.add_metric([kind], counts["cancel"])
    yield timeouts
    yield cancels
    oldest = status.oldest_due_job
    yield _gauge(
        "worker_job_oldest_due_seconds",
        "How long the oldest due queued job has waited (0 when none is due).",
        oldest["waiting_seconds"] if oldest else 0,
    )
    yield _gauge(
        "worker_database_oldest_transaction_seconds",
        "Age of the oldest transaction another session keeps open on the database (0 when "
        "none): while it holds a snapshot, no dead row version can be removed.",
        status.oldest_transaction["age_seconds"] if status.oldest_transaction else 0,
    )
    yield _gauge(
        "worker_jobs_stuck",
        "Jobs in processing past their lease (the reaper is not running).",
        status.stuck_jobs_total,
    )
    mail = GaugeMetricFamily("worker_inbound_emails", "Inbound mail by status.", labels=["status"])
    for state, n in fold(status.inbound_by_status, InboundEmail.Status.values).items():
        mail.add_metric([state], n)
    yield mail
    yield _gauge(
        "worker_instructions_needing_operator",
        "PI instructions Slack never accepted, waiting in the database inbox, unacknowledged.",
        status.instructions_needing_operator,
    )
    yield _gauge(
        "worker_instruction_relays_stuck",
        "Mail awaiting its instruction relay for over 24 h.",
        status.instruction_relays_stuck,
    )
    notes = GaugeMetricFamily(
        "worker_notifications", "Email notifications by status.", labels=["status"]
    )
    for state, n in fold(status.notifications_by_status, EmailNotification.Status.values).items():
        notes.add_metric([state], n)
    yield notes
    yield _gauge(
        "worker_notifications_stuck_sending",
        "Notifications claimed for sending longer than the claim timeout.",
        status.notifications_stuck_sending,
    )
    leases = GaugeMetricFamily(
        "worker_writer_slot_leases", "Writer slots held by a live writer.", labels=["role"]
    )
    by_role: dict[str, int] = {}
    for lease in status.leases:
        by_role[lease["role"]] = by_role.get(lease["role"], 0) + 1
    for role, n in sorted(by_role.items()):
        leases.add_metric([role], n)
    yield leases
    yield from _sending_metrics(status)
    yield _gauge(
        "worker_tasks_refused",
        "django-q2 tasks refused for naming a function outside the code's allowlist "
        "(unacknowledged).",
        status.tasks_refused,
    )
    yield _gauge(
        "worker_schedules_unknown",
        "Enabled schedules not defined in code (the worker refuses their tasks).",
        len(status.unknown_schedules),
    )
    processes = GaugeMetricFamily(
        "worker_processes_live",
        "Processes beating in the registry (silent for 3 beats = gone), by role.",
        labels=["role"],
    )
    live_by_role: dict[str, int] = {}
    for process in status.processes:
        if process["state"] == "live":
            live_by_role[process["role"]] = live_by_role.get(process["role"], 0) + 1
    for role, n in sorted(live_by_role.items()):
        processes.add_metric([role], n)
    yield processes
    yield _gauge(
        "worker_schedules_overdue",
        "qcluster schedules with no run for two intervals.",
        sum(1 for schedule in status.schedules if schedule["overdue"]),
    )
    yield _gauge(
        "worker_needs_operator_findings",
        "Findings worker_status lists under NEEDS AN OPERATOR (it exits 1 when above 0).",
        len(status.needs_operator),
    )


def _sending_metrics(status: WorkerStatus) -> Iterator[Metric]:
    """The sending pause (SES daily quota), the pace and the bounce / complaint rates (issue 23)."""
    paused_until = status.sending.get("paused_until")
    yield _gauge(
        "worker_notifications_sending_paused",
        "1 while all sending is paused because SES's daily quota is spent, else 0.",
        1 if paused_until else 0,
    )
    yield _gauge(
        "worker_notifications_sending_paused_until_seconds",
        "Unix time the sending pause ends (then SES is asked again); 0 when not paused.",
        datetime.fromisoformat(paused_until).timestamp() if paused_until else 0,
    )
    feedback = status.mail_feedback
    for name, key, doc in (
        ("worker_notifications_bounce_rate", "bounce_rate", "Hard bounces / mails sent"),
        ("worker_notifications_complaint_rate", "complaint_rate", "Complaints / mails sent"),
    ):
        yield _gauge(name, f"{doc}, last 24 h (SES reviews at 5 % / 0.1 %).", feedback.get(key, 0))
    yield _gauge(
        "worker_notifications_suppressed_addresses",
        "Addresses on the suppression list (bounced or complained), active now.",
        feedback.get("suppressed_addresses", 0),
    )
    yield _gauge(
        "worker_notifications_max_send_rate",
        "Mails per second the sends are paced to (SES MaxSendRate as last read; 0: not yet).",
        status.sending.get("max_send_rate") or 0,
    )


def render_metrics() -> bytes:
    """The text exposition format of one fresh read."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerStatusCollector())
    return generate_latest(registry)
