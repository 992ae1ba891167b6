"""notifications.selectors: what "stuck in sending" means, shared by the reconciler and
worker_status."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker

from notifications.models import EmailNotification
from notifications.selectors import notification_status_counts, notifications_stuck_sending
from notifications.sending import notification_reconcile_stale_claims

pytestmark = pytest.mark.django_db


def test_stuck_sending_follows_the_claim_timeout_setting_and_the_reconciler_agrees(settings):
    settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS = 600
    now = timezone.now()
    stale = baker.make(EmailNotification, status="sending", claimed_at=now - timedelta(seconds=601))
    baker.make(EmailNotification, status="sending", claimed_at=now - timedelta(seconds=599))
    baker.make(EmailNotification, status="pending", claimed_at=now - timedelta(hours=1))

    assert list(notifications_stuck_sending(now=now)) == [stale]
    assert notification_status_counts() == {"pending": 1, "sending": 2}

    # The reconciler hands back exactly the rows the selector calls stuck.
    assert notification_reconcile_stale_claims(kind=None, now=now) == 1
    stale.refresh_from_db()
    assert stale.status == "pending"
    assert not notifications_stuck_sending(now=now).exists()
