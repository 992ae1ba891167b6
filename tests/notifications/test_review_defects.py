"""Defects found in review (R2 digest wording, R5 retry action): each fails without its fix."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission
from django.core import mail
from django.urls import reverse
from model_bakery import baker

from notifications.models import EmailNotification
from notifications.sweeps import sweep_digests

pytestmark = pytest.mark.django_db
MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
Status = EmailNotification.Status


def test_r2_digest_does_not_invite_instructions(make_pi):
    """R2: the digest said "Reply to this email to give the agent instructions", but a digest
    has no proposal, so such an instruction could not be routed to any conversation."""
    make_pi(proposals=2, rung="daily")
    assert sweep_digests(now=MONDAY_9).sent == 1
    [message] = mail.outbox
    html = message.alternatives[0][0]
    for text in (message.body, html):
        assert "instruction" not in text.lower()
        assert "reply to this email" not in text.lower()
        assert "unsubscribe" in text  # the way out is still offered


def _digest(user, status: str) -> EmailNotification:
    return baker.make(
        EmailNotification,
        user=user,
        kind=EmailNotification.Kind.DIGEST,
        proposal=None,
        status=status,
        to_address=user.email,
        claimed_at=MONDAY_9 if status == Status.SENDING else None,
    )


def test_r5_retrying_a_failed_digest_while_another_is_unsent_reports_instead_of_500(
    make_pi, admin_client
):
    """R5: retrying a failed digest while the user already has an unsent one hit the unique
    constraint `one_unsent_digest_per_user`: an uncaught IntegrityError, HTTP 500, and the
    other selected rows were not retried either."""
    blocked_user, free_user = make_pi(rung="daily"), make_pi(rung="daily")
    blocked = _digest(blocked_user, Status.FAILED)
    _digest(blocked_user, Status.PENDING)
    free = _digest(free_user, Status.FAILED)

    response = admin_client.post(
        reverse("admin:notifications_emailnotification_changelist"),
        {"action": "retry_failed", "_selected_action": [blocked.pk, free.pk]},
        follow=True,
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert "Queued 1 failed notification(s) again." in page
    assert f"#{blocked.pk} could not be retried" in page
    assert "unsent digest" in page
    blocked.refresh_from_db()
    free.refresh_from_db()
    assert (blocked.status, free.status) == (Status.FAILED, Status.PENDING)


def test_r5_retry_needs_the_change_permission(make_pi, client):
    row = _digest(make_pi(rung="daily"), Status.FAILED)
    viewer = baker.make("auth.User", username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_emailnotification"))
    client.force_login(viewer)
    url = reverse("admin:notifications_emailnotification_changelist")
    assert "retry_failed" not in client.get(url).content.decode()
    client.post(url, {"action": "retry_failed", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.status == Status.FAILED
