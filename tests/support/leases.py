"""Writer-slot lease rows for tests of the operator's views.

Lease rows are written on a connection of their own (canonical_ids.leases), so rows of
earlier tests in the same run are still there: every pool slot may have a row, some of them
live. Tests take slots that no live writer holds, overwrite their rows (inside the test's
transaction), and count live leases relative to what was there before.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from canonical_ids.models import WriterSlotLease
from canonical_ids.selectors import leases_live


def spare_slots(count: int) -> list[int]:
    """`count` worker-pool slots no live writer holds (highest first, the least used)."""
    now = timezone.now()
    live = set(
        WriterSlotLease.objects.filter(~Q(expires_at=None), expires_at__gt=now).values_list(
            "slot", flat=True
        )
    )
    spare = [slot for slot in range(99, 9, -1) if slot not in live]
    assert len(spare) >= count, "every writer slot is held by a live writer"
    return spare[:count]


def live_lease_count(*, now: datetime) -> int:
    return leases_live(now=now).count()


def make_lease(*, slot: int, now: datetime, live: bool | None, **fields) -> WriterSlotLease:
    """The slot's row as a writer left it: live (60 s left), expired (`live=False`) or
    released (`live=None`, no expiry)."""
    if live is None:
        expires = None
    else:
        expires = now + timedelta(seconds=60) if live else now - timedelta(seconds=1)
    fields.setdefault("role", "worker")
    lease, _ = WriterSlotLease.objects.update_or_create(
        slot=slot, defaults={"acquired_at": now, "expires_at": expires, **fields}
    )
    return lease
