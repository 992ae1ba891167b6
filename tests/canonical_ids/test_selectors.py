"""canonical_ids.selectors: which writer slots are held by a live writer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from canonical_ids.models import WriterSlotLease
from canonical_ids.selectors import leases_live
from tests.support.leases import free_slots

pytestmark = pytest.mark.django_db


def test_only_unexpired_leases_are_live():
    now = timezone.now()
    high, expired, released, low = free_slots(4)  # descending
    WriterSlotLease.objects.create(slot=high, role="worker", expires_at=now + timedelta(seconds=30))
    WriterSlotLease.objects.create(
        slot=expired, role="worker", expires_at=now - timedelta(seconds=1)
    )
    WriterSlotLease.objects.create(slot=released, role="worker", expires_at=None)
    WriterSlotLease.objects.create(slot=low, role="worker", expires_at=now + timedelta(seconds=5))
    mine = {high, expired, released, low}
    # (rows of earlier tests' writers may be there too: leases are committed on their own)
    assert [lease.slot for lease in leases_live(now=now) if lease.slot in mine] == [low, high]
