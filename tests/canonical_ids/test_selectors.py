"""canonical_ids.selectors: which writer slots are held by a live writer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from canonical_ids.models import WriterSlotLease
from canonical_ids.selectors import leases_live

pytestmark = pytest.mark.django_db


def test_only_unexpired_leases_are_live():
    now = timezone.now()
    WriterSlotLease.objects.create(slot=12, role="worker", expires_at=now + timedelta(seconds=30))
    WriterSlotLease.objects.create(slot=11, role="worker", expires_at=now - timedelta(seconds=1))
    WriterSlotLease.objects.create(slot=10, role="worker", expires_at=None)  # released
    WriterSlotLease.objects.create(slot=4, role="worker", expires_at=now + timedelta(seconds=5))
    assert [lease.slot for lease in leases_live(now=now)] == [4, 12]
