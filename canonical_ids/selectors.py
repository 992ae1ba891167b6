"""Reads of the writer-slot leases for the operator's views (admin, worker_status, /metrics)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from canonical_ids.models import WriterSlotLease


def leases_live(*, now: datetime) -> QuerySet[WriterSlotLease]:
    """Slots held by a live writer: a lease whose expiry is still ahead (a dead process's slot
    is free once its lease runs out; a released one has no expiry)."""
    return WriterSlotLease.objects.filter(expires_at__gt=now).order_by("slot")
