"""canonical_ids.selectors: which writer slots are held by a live writer."""

from __future__ import annotations

import pytest
from django.utils import timezone

from canonical_ids.selectors import leases_live
from tests.support.leases import make_lease, spare_slots

pytestmark = pytest.mark.django_db


def test_only_unexpired_leases_are_live():
    now = timezone.now()
    high, expired, released, low = spare_slots(4)  # descending
    make_lease(slot=high, now=now, live=True)
    make_lease(slot=expired, now=now, live=False)
    make_lease(slot=released, now=now, live=None)
    make_lease(slot=low, now=now, live=True)
    mine = {high, expired, released, low}
    # (rows of earlier tests' writers may be there too: leases are committed on their own)
    assert [lease.slot for lease in leases_live(now=now) if lease.slot in mine] == [low, high]
