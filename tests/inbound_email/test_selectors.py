"""inbound_email.selectors: quarantine, stuck relays, instructions needing an operator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail, Reply
from inbound_email.selectors import (
    RELAY_STUCK_AFTER,
    inbound_received_per_bucket,
    inbound_relays_stuck,
    inbound_status_counts,
    replies_needing_operator,
)
from notifications.models import EmailNotification

pytestmark = pytest.mark.django_db


def _mail(key: str, status: str, **fields) -> InboundEmail:
    return baker.make(InboundEmail, store_key=key, status=status, **fields)


def test_relay_is_stuck_only_after_the_threshold():
    now = timezone.now()
    stuck = _mail("k1", "awaiting_relay")
    _mail("k2", "awaiting_relay")
    old_processed = _mail("k3", "processed")
    InboundEmail.objects.filter(pk__in=[stuck.pk, old_processed.pk]).update(
        updated_at=now - RELAY_STUCK_AFTER - timedelta(minutes=1)
    )
    assert list(inbound_relays_stuck(now=now)) == [stuck]
    assert inbound_status_counts() == {"awaiting_relay": 2, "processed": 1}


def test_an_acknowledged_instruction_no_longer_needs_an_operator():
    notification = baker.make(EmailNotification, status="pending")
    waiting, acknowledged, posted = (
        baker.make(
            Reply,
            notification=notification,
            inbound_email=_mail(f"r{i}", "processed"),
            relay_status=relay,
            needs_operator=flag,
            operator_acknowledged_at=ack,
        )
        for i, (relay, flag, ack) in enumerate(
            [
                ("inboxed", True, None),
                ("inboxed", True, timezone.now()),
                ("posted", False, None),
            ]
        )
    )
    assert list(replies_needing_operator()) == [waiting]
    assert acknowledged.pk and posted.pk


def test_received_per_bucket_buckets_by_hour_and_current_status():
    now = datetime(2026, 12, 3, 12, 30, tzinfo=UTC)
    hour = now.replace(minute=0)
    for key, status, at in [
        ("a", "processed", hour + timedelta(minutes=1)),
        ("b", "processed", hour + timedelta(minutes=59)),
        ("c", "quarantined", hour - timedelta(minutes=30)),
        ("d", "processed", now - timedelta(hours=30)),  # before the window
    ]:
        row = _mail(key, status)
        InboundEmail.objects.filter(pk=row.pk).update(created_at=at)

    series = inbound_received_per_bucket(since=now - timedelta(hours=24), step=timedelta(hours=1))

    assert series == {
        "processed": {hour: 2},
        "quarantined": {hour - timedelta(hours=1): 1},
    }
