"""Services the other apps and the admin call: mark responded, unsubscribe, restore."""

from __future__ import annotations

import pytest

from notifications.exceptions import NotificationNotOpen
from notifications.models import EmailNotification, NotificationPreference
from notifications.services import (
    notification_mark_responded,
    notification_unsubscribe,
    preference_restore_rung,
)
from notifications.sweeps import sweep_proposal_reviews

pytestmark = pytest.mark.django_db


def test_mark_responded_only_from_sent(make_pi):
    pi = make_pi()
    sweep_proposal_reviews()
    row = EmailNotification.objects.get(user=pi)
    notification_mark_responded(notification_id=row.pk)
    row.refresh_from_db()
    assert row.status == "responded" and row.responded_at is not None
    with pytest.raises(NotificationNotOpen):
        notification_mark_responded(notification_id=row.pk)


def test_unsubscribe_pauses_and_restore_brings_back(make_pi):
    pi = make_pi()
    sweep_proposal_reviews()
    row = EmailNotification.objects.get(user=pi)
    assert notification_unsubscribe(token=row.token).rung == "paused"
    assert NotificationPreference.objects.get(user=pi).downgraded_at is not None
    assert preference_restore_rung(user_id=pi.pk).rung == "immediate"
