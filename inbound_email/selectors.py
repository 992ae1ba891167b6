"""Reads of the mail ledger and the replies that the operator's views need (worker_status,
the health page, /metrics): what "quarantined", "stuck relay" and "needs an operator" mean
is decided here once."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, F, Func, IntegerField, Min, QuerySet

from inbound_email.models import InboundEmail, Reply
from project.pg_time import DateBin

# A mail awaiting its instruction relay this long means the relay is stuck (the retries spent
# their budget long before, or the relay jobs do not run).
RELAY_STUCK_AFTER = timedelta(hours=24)


def inbound_status_counts() -> dict[str, int]:
    """Ledger rows per status, only the statuses that have rows, in name order."""
    # Count("*"), not Count("id"): the count is read from a (status, ...) index alone.
    rows = InboundEmail.objects.values("status").annotate(n=Count("*")).order_by("status")
    return {row["status"]: row["n"] for row in rows}


def inbound_emails_quarantined() -> QuerySet[InboundEmail]:
    """Mail kept aside for an operator: view, reprocess or discard it (I6)."""
    return InboundEmail.objects.filter(status=InboundEmail.Status.QUARANTINED)


def inbound_emails_awaiting_relay() -> QuerySet[InboundEmail]:
    """Accepted mail whose instruction is not yet posted or inboxed (its raw mail kept, I8)."""
    return InboundEmail.objects.filter(status=InboundEmail.Status.AWAITING_RELAY)


def inbound_relays_stuck(*, now: datetime) -> QuerySet[InboundEmail]:
    """Mail that has awaited its relay for longer than RELAY_STUCK_AFTER."""
    return inbound_emails_awaiting_relay().filter(updated_at__lt=now - RELAY_STUCK_AFTER)


def replies_needing_operator() -> QuerySet[Reply]:
    """Instructions Slack never accepted (they went to the database inbox) that no operator
    has acknowledged yet; acknowledging clears them (R6)."""
    return Reply.objects.filter(needs_operator=True, operator_acknowledged_at__isnull=True)


def inbound_received_per_bucket(
    *, since: datetime, step: timedelta
) -> dict[str, dict[datetime, int]]:
    """Mail received per bucket of width `step` since `since` (bucket starts counted from the
    epoch in UTC: project.pg_time.DateBin), by the status each row has now.

    Only the known statuses (the chart draws those): naming them lets a (status, created_at)
    index answer alone; Count("*") needs no column from the heap."""
    rows = (
        InboundEmail.objects.filter(status__in=InboundEmail.Status.values, created_at__gte=since)
        .annotate(bucket=DateBin(step, F("created_at")))
        .values("bucket", "status")
        .annotate(n=Count("*"))
        .order_by("bucket", "status")
    )
    series: dict[str, dict[datetime, int]] = {}
    for row in rows:
        series.setdefault(row["status"], {})[row["bucket"]] = row["n"]
    return series


def inbound_email_raw_kept_bytes(*, inbound_email_id: int) -> int | None:
    """How many raw bytes the row keeps (None: none), without loading them (the admin shows
    when a rejected mail kept only its first bytes)."""
    return (
        InboundEmail.objects.filter(pk=inbound_email_id)
        .annotate(kept=Func(F("raw"), function="octet_length", output_field=IntegerField()))
        .values_list("kept", flat=True)
        .first()
    )


def inbound_quarantine_oldest() -> datetime | None:
    """When the longest-waiting quarantined mail was quarantined (None: none is): quarantined
    mail is kept until an operator acts, so its age is what the health page shows."""
    return inbound_emails_quarantined().aggregate(oldest=Min("finished_at"))["oldest"]
