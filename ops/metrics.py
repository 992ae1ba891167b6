"""worker_status's figures as Prometheus metrics, read from the database at scrape time.

A custom collector on a registry of its own per scrape: the figures are table counts, not
per-process counters, so every web worker answers the same and nothing is kept in memory
between scrapes (no multiprocess mode needed under gunicorn).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ops.rates import rate_metrics
from ops.status import WorkerStatus, worker_status


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
    for kind, counts in status.jobs_by_kind.items():
        for state, n in counts.items():
            jobs.add_metric([kind, state], n)
    yield jobs
    oldest = status.oldest_due_job
    yield _gauge(
        "worker_job_oldest_due_seconds",
        "How long the oldest due queued job has waited (0 when none is due).",
        oldest["waiting_seconds"] if oldest else 0,
    )
    yield _gauge(
        "worker_jobs_stuck",
        "Jobs in processing past their lease (the reaper is not running).",
        status.stuck_jobs_total,
    )
    mail = GaugeMetricFamily("worker_inbound_emails", "Inbound mail by status.", labels=["status"])
    for state, n in status.inbound_by_status.items():
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
    for state, n in status.notifications_by_status.items():
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


def render_metrics() -> bytes:
    """The text exposition format of one fresh read."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerStatusCollector())
    return generate_latest(registry)
