"""Writer-slot lease rows for tests of the operator's views.

Lease rows are written on a connection of their own (canonical_ids.leases), so rows from
earlier tests in the same run may still be there, live or expired: tests pick slots nobody
holds a row for, and count live leases relative to what was there before.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from canonical_ids.models import WriterSlotLease
from canonical_ids.selectors import leases_live


def free_slots(count: int) -> list[int]:
    """`count` worker-pool slots with no lease row at all (highest first, rarely used)."""
    taken = set(WriterSlotLease.objects.values_list("slot", flat=True))
    free = [slot for slot in range(99, 9, -1) if slot not in taken]
    assert len(free) >= count, "no free writer slots left for the test"
    return free[:count]


def live_lease_count(*, now: datetime) -> int:
    return leases_live(now=now).count()


def make_lease(*, slot: int, now: datetime, live: bool, **fields) -> WriterSlotLease:
    expires = now + timedelta(seconds=60) if live else now - timedelta(seconds=1)
    fields.setdefault("role", "worker")
    return WriterSlotLease.objects.create(slot=slot, acquired_at=now, expires_at=expires, **fields)
