"""Retention of the mail ledger (issue 21): finished rows are pruned after
`INBOUND_RETENTION_DAYS` (default 30, as Rails' Action Mailbox incinerates), in batches, by
an hourly schedule (`inbound_email.tasks.prune_inbound_email`, ops/schedules.py).

What is pruned: rows `processed`, `rejected` or `discarded` that finished before the cutoff.
What never is: `quarantined` mail (kept until an operator reprocesses or discards it; the
health page shows how many and how old), mail still to handle or awaiting its relay, and a
row that carries an accepted `Reply` (the reply is the record of the PI's answer and
protects its mail row; its raw source was cleared when it was processed).

Batches: each is one short transaction that locks its rows with SKIP LOCKED (a row an
operator or a poller holds is left for the next run), so the schedule never holds a long
lock and two workers running it at once do not collide. A run stops after `max_seconds`,
well inside the django-q2 task timeout; the next run carries on.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from inbound_email.conf import get_config
from inbound_email.models import InboundEmail

logger = logging.getLogger(__name__)

Status = InboundEmail.Status
PRUNED_STATUSES = (Status.PROCESSED, Status.REJECTED, Status.DISCARDED)


def inbound_email_prune(
    *,
    now: datetime | None = None,
    older_than_days: float | None = None,
    batch_size: int = 1000,
    max_seconds: float = 120,
) -> int:
    """Delete finished mail rows older than the retention, `batch_size` rows a transaction,
    until none is left or `max_seconds` have passed; returns how many were deleted."""
    now = now or timezone.now()
    days = get_config().retention_days if older_than_days is None else older_than_days
    cutoff = now - timedelta(days=days)
    statuses = [str(s) for s in PRUNED_STATUSES]
    deadline = time.monotonic() + max_seconds
    total = 0
    while True:
        with transaction.atomic():
            ids = list(
                InboundEmail.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(status__in=statuses, finished_at__lt=cutoff, reply__isnull=True)
                .order_by("finished_at")
                .values_list("pk", flat=True)[:batch_size]
            )
            if ids:
                # The ORM's delete, so every relation is honoured (a duplicate's
                # `duplicate_of` is set to NULL); only the ids are loaded, never the raw bytes.
                InboundEmail.objects.filter(pk__in=ids).only("pk").delete()
        total += len(ids)
        if len(ids) < batch_size or time.monotonic() >= deadline:
            break
    if total:
        logger.info(
            "inbound mail pruned: %s rows finished before %s",
            total,
            cutoff.isoformat(),
            extra={"action": "inbound_pruned", "count": total},
        )
    return total
