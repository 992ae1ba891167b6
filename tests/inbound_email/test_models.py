"""The ledger's models: a proposal whose notifications have replies cannot be deleted."""

from __future__ import annotations

import pytest
from django.db.models import ProtectedError
from django.urls import reverse

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from notifications.models import NotificationPreference
from tests.support.mail import build_mail

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status


def test_a_proposal_with_replies_cannot_be_deleted(folder_store, notification, admin_client):
    """R3: deleting a proposal cascaded through its notifications to the Reply and left the
    mail `awaiting_relay` forever. The Reply protects its notification, and the admin offers
    no delete for proposals or preferences (deleting a preference un-pauses a user)."""
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))
    poll_once()
    assert Reply.objects.count() == 1

    with pytest.raises(ProtectedError):
        notification.proposal.delete()
    assert Reply.objects.count() == 1
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY

    proposal_delete = reverse(
        "admin:notifications_proposal_delete", args=[notification.proposal.pk]
    )
    assert admin_client.get(proposal_delete).status_code == 403
    preference, _ = NotificationPreference.objects.update_or_create(
        user=notification.user, defaults={"rung": "paused"}
    )
    preference_delete = reverse(
        "admin:notifications_notificationpreference_delete", args=[preference.pk]
    )
    assert admin_client.post(preference_delete, {"post": "yes"}).status_code == 403
    assert NotificationPreference.objects.get(pk=preference.pk).rung == "paused"
