"""Reads of the process registry for worker_status, the health page and the admin.

Live and gone are judged on the database clock (`Now()` in the query), like the beats.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import Now

from processes.conf import GONE_LISTED_SECONDS
from processes.models import WorkerProcess

LIVE = Q(stopped_at__isnull=True, gone_after__gt=Now())
RECENT = Q(heartbeat_at__gt=Now() - timedelta(seconds=GONE_LISTED_SECONDS))


def processes_live() -> QuerySet[WorkerProcess]:
    """Processes that beat within their last MISSED_BEATS intervals and did not stop."""
    return WorkerProcess.objects.filter(LIVE)


def processes_gone() -> QuerySet[WorkerProcess]:
    """Processes that stopped, or fell silent for MISSED_BEATS intervals (killed, host lost)."""
    return WorkerProcess.objects.exclude(LIVE)


def processes_gone_recently() -> QuerySet[WorkerProcess]:
    """Gone processes whose last beat is within GONE_LISTED_SECONDS."""
    return processes_gone().filter(RECENT)


def processes_listed() -> QuerySet[WorkerProcess]:
    """The live processes and those gone within GONE_LISTED_SECONDS, live first, each row
    annotated with `live`."""
    return (
        WorkerProcess.objects.filter(LIVE | RECENT)
        .annotate(live=ExpressionWrapper(LIVE, output_field=BooleanField()))
        .order_by("-live", "role", "host", "pid", "-started_at")
    )
