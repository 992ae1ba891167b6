"""The admin's Worker health page: worker_status's figures as tiles, plus 24 h charts.

Every figure comes from worker_status (itself built on the apps' selectors) or straight from
a selector; every tile links to the admin changelist filtered to exactly the rows it counts
(`?status__exact=…` or the apps' `?health=…` selector filters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlencode

from django.urls import reverse

from canonical_ids.models import WriterSlotLease
from inbound_email.models import InboundEmail, Reply
from inbound_email.selectors import inbound_quarantine_oldest, inbound_received_per_bucket
from jobs.conf import get_config as get_jobs_config
from jobs.models import Job, KindCap, KindRate, PausedKind
from jobs.pruning import last_prune_runs
from jobs.selectors import jobs_due, jobs_finished_per_bucket
from notifications.models import EmailNotification
from notifications.selectors import OPEN as OPEN_NOTIFICATION_STATUSES
from ops.charts import Chart, SeriesIn, bucket_floor, buckets, stacked_bar_chart
from ops.conf import get_config
from ops.durations import humanize_seconds
from ops.job_periods import PERIOD, KindTable, finished_per_bucket, kind_table
from ops.ranges import DEFAULT_RANGE, RANGES, ChartRange
from ops.status import BACKLOG_ALERT_SECONDS, WorkerStatus, describe_session, worker_status
from processes.models import WorkerProcess

MAIL_COLORS = {
    InboundEmail.Status.PROCESSED: "#2e7d32",
    InboundEmail.Status.AWAITING_RELAY: "#1565c0",
    InboundEmail.Status.RECEIVED: "#90a4ae",
    InboundEmail.Status.REJECTED: "#ef6c00",
    InboundEmail.Status.QUARANTINED: "#c62828",
    InboundEmail.Status.DISCARDED: "#6d4c41",
}


@dataclass(frozen=True)
class Tile:
    label: str
    value: int
    url: str
    alert: bool = False  # this figure is one of worker_status's findings
    note: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    tiles: tuple[Tile, ...]


@dataclass
class Health:
    status: WorkerStatus
    sections: list[Section] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    generated_at: datetime | None = None
    paused_url: str = ""
    caps_url: str = ""  # issue 37: the caps per kind in the admin
    rates_url: str = ""  # issue 38: the rates per kind in the admin
    chart_range: ChartRange = RANGES[DEFAULT_RANGE]
    kinds: KindTable | None = None
    # Issue 32: the oldest open transaction in words ("" when none), and whether it is old
    # enough to be one of the findings.
    oldest_transaction: str = ""
    long_transaction: bool = False
    long_transaction_after: str = ""
    # Issue 38, point 6: what job pruning deleted, in words.
    pruning: str = ""


def changelist(model: type, **params: str) -> str:
    """The admin changelist URL of `model`, filtered by `params`."""
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def worker_health(
    *, now: datetime | None = None, chart_range: ChartRange = RANGES[DEFAULT_RANGE]
) -> Health:
    status = worker_status(now=now)
    now = status.now  # by default the database's time, read with the status (one clock)
    health = Health(
        status=status,
        generated_at=now,
        paused_url=changelist(PausedKind),
        caps_url=changelist(KindCap),
        rates_url=changelist(KindRate),
        chart_range=chart_range,
    )
    _oldest_transaction(health)
    health.pruning = job_pruning_summary(now)
    health.sections = [
        _processes_section(status),
        _jobs_section(status, now),
        _mail_section(status, now),
        _notifications_section(status),
        Section("Schedules", ()),
        Section(
            "Writer slots",
            (
                Tile(
                    "held by a live writer",
                    len(status.leases),
                    changelist(WriterSlotLease, health="live"),
                ),
            ),
        ),
    ]
    health.kinds = kind_table(
        now=now, counts_by_kind=status.jobs_by_kind, window=chart_range.window
    )
    health.charts = _charts(now, chart_range)
    return health


def _oldest_transaction(health: Health) -> None:
    limit = get_config().long_transaction_alert_seconds
    health.long_transaction_after = humanize_seconds(limit)
    oldest = health.status.oldest_transaction
    if oldest:
        health.oldest_transaction = (
            f"open {humanize_seconds(oldest['age_seconds'])}: {describe_session(oldest)}"
        )
        health.long_transaction = oldest["age_seconds"] > limit


def job_pruning_summary(now: datetime) -> str:
    """The last pruning run and the last 24 h of them, with each state's retention."""
    config = get_jobs_config()
    kept = (
        f"kept: completed {config.retention_days:g} d, failed {config.failed_retention_days:g} d, "
        f"cancelled {config.cancelled_retention_days:g} d"
    )
    runs = last_prune_runs(limit=25)
    if not runs:
        return f"no run recorded yet ({kept})"
    last = runs[0]
    day = [run for run in runs if (now - run.ran_at).total_seconds() <= 86400]

    def said(done: list) -> str:
        return (
            f"{sum(r.completed for r in done)} completed, {sum(r.failed for r in done)} failed, "
            f"{sum(r.cancelled for r in done)} cancelled, "
            f"{sum(r.unique_keys for r in done)} expired unique keys, "
            f"{sum(r.periodic_ticks for r in done)} periodic ticks"
        )

    return (
        f"last run {last.ran_at:%Y-%m-%d %H:%M} UTC deleted {said([last])} "
        f"in {last.seconds:.1f} s; last 24 h ({len(day)} runs): {said(day)} ({kept})"
    )


def _processes_section(status: WorkerStatus) -> Section:
    """The process registry (issue 20): live, and gone within the last hour; the table below
    the tiles lists each with its host, pid, version, last beat and current work."""
    live = sum(1 for p in status.processes if p["state"] == "live")
    silent = sum(1 for p in status.processes if p["state"] == "gone")
    return Section(
        "Processes",
        (
            Tile("live", live, changelist(WorkerProcess, health="live")),
            Tile(
                "gone in the last hour",
                len(status.processes) - live,
                changelist(WorkerProcess, health="gone_recently"),
                note=f"{silent} fell silent (killed, host lost)" if silent else "",
            ),
        ),
    )


def _jobs_section(status: WorkerStatus, now: datetime) -> Section:
    by_status = status.jobs_by_status
    oldest = status.oldest_due_job
    waited = oldest["waiting_seconds"] if oldest else 0
    tiles = [
        Tile(
            Job.Status(value).label.lower(),
            by_status.get(value, 0),
            changelist(Job, status__exact=value),
            alert=value == Job.Status.FAILED and bool(by_status.get(value)),
        )
        for value in Job.Status.values
    ]
    tiles += [
        Tile(
            "due now",
            jobs_due(now=now).count(),
            changelist(Job, health="due"),
            alert=waited > BACKLOG_ALERT_SECONDS,
            note=f"oldest waiting {humanize_seconds(waited)}" if oldest else "",
        ),
        Tile(
            "stuck past their lease",
            status.stuck_jobs_total,
            changelist(Job, health="stuck"),
            alert=bool(status.stuck_jobs_total),
        ),
    ]
    return Section("Job queue", tuple(tiles))


def _mail_section(status: WorkerStatus, now: datetime) -> Section:
    by_status = status.inbound_by_status
    oldest_quarantined = inbound_quarantine_oldest()
    tiles = [
        Tile(
            InboundEmail.Status(value).label,
            by_status.get(value, 0),
            changelist(InboundEmail, status__exact=value),
            alert=value == InboundEmail.Status.QUARANTINED and bool(by_status.get(value)),
            # Quarantined mail is kept until an operator acts (never pruned): its age shows.
            note=(
                f"oldest {humanize_seconds(now - oldest_quarantined)}"
                if value == InboundEmail.Status.QUARANTINED and oldest_quarantined
                else ""
            ),
        )
        for value in InboundEmail.Status.values
    ]
    tiles += [
        Tile(
            "relays stuck over 24 h",
            status.instruction_relays_stuck,
            changelist(InboundEmail, health="relay_stuck"),
            alert=bool(status.instruction_relays_stuck),
        ),
        Tile(
            "instructions needing an operator",
            status.instructions_needing_operator,
            changelist(Reply, health="needs_operator"),
            alert=bool(status.instructions_needing_operator),
        ),
    ]
    return Section("Inbound mail", tuple(tiles))


def _notifications_section(status: WorkerStatus) -> Section:
    by_status = status.notifications_by_status
    tiles = [
        Tile(
            f"open: {EmailNotification.Status(value).label.lower()}",
            by_status.get(value, 0),
            changelist(EmailNotification, status__exact=value),
        )
        for value in OPEN_NOTIFICATION_STATUSES
    ]
    tiles.append(
        Tile(
            "stuck in sending",
            status.notifications_stuck_sending,
            changelist(EmailNotification, health="stuck_sending"),
            alert=bool(status.notifications_stuck_sending),
        )
    )
    return Section("Notifications", tuple(tiles))


def _charts(now: datetime, chart_range: ChartRange) -> list[Chart]:
    """Jobs finished and mail received over the range, one bar per bucket (issue 20: 60, 48
    or 56 bars, never 1,440 hairlines), the y axis naming what a bar counts."""
    step = chart_range.step
    starts = buckets(end=bucket_floor(now, step), step=step, count=chart_range.bars)
    common = {
        "starts": starts,
        "tick_every": chart_range.tick_every,
        "narrow_tick_every": chart_range.narrow_tick_every,
        "tick_format": chart_range.tick_format,
        "bucket_format": chart_range.bucket_format,
    }
    # 30-minute and 3-hour bars: the trigger-kept periods; 1-minute bars: the jobs table
    # (an hour of rows, through its status index).
    if step % PERIOD:
        finished = jobs_finished_per_bucket(since=starts[0], step=step)
    else:
        finished = finished_per_bucket(since=starts[0], step=step)
    jobs_chart = stacked_bar_chart(
        title=f"Jobs finished, last {chart_range.label}",
        y_label=f"jobs {chart_range.per}",
        series=[
            SeriesIn("completed", "#2e7d32", finished[Job.Status.COMPLETED]),
            SeriesIn("failed", "#c62828", finished[Job.Status.FAILED]),
        ],
        **common,
    )
    received = inbound_received_per_bucket(since=starts[0], step=step)
    mail_chart = stacked_bar_chart(
        title=f"Mail received, last {chart_range.label}, by status now",
        y_label=f"mails {chart_range.per}",
        series=[
            SeriesIn(InboundEmail.Status(value).label, color, received.get(value, {}))
            for value, color in MAIL_COLORS.items()
        ],
        **common,
    )
    return [jobs_chart, mail_chart]
