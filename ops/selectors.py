"""Reads of the ops app's own rows."""

from __future__ import annotations

from django.db.models import QuerySet

from ops.models import RefusedTask


def tasks_refused() -> QuerySet[RefusedTask]:
    """Refused tasks no operator has acknowledged yet (acknowledging deletes the row)."""
    return RefusedTask.objects.all()
