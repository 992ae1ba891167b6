"""The admin: read-only notification rows, the restore-rung and retry-failed actions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from model_bakery import baker

from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_new_proposals
from tests.support.admin_columns import columns_read

pytestmark = pytest.mark.django_db
Rung = NotificationPreference.Rung


def test_restore_rung_action(make_pi, admin_client):
    pi = make_pi(rung=Rung.PAUSED)
    NotificationPreference.objects.filter(user=pi).update(consecutive_missed=2)
    preference = NotificationPreference.objects.get(user=pi)
    response = admin_client.post(
        reverse("admin:notifications_notificationpreference_changelist"),
        {"action": "restore_rung", "_selected_action": [preference.pk]},
        follow=True,
    )
    assert response.status_code == 200
    preference.refresh_from_db()
    assert (preference.rung, preference.consecutive_missed, preference.downgraded_at) == (
        Rung.IMMEDIATE,
        0,
        None,
    )


def test_notification_admin_is_read_only_with_filters(make_pi, admin_client):
    pi = make_pi()
    sweep_new_proposals()
    row = EmailNotification.objects.get(user=pi)
    changelist = reverse("admin:notifications_emailnotification_changelist")
    assert admin_client.get(changelist, {"status__exact": "sent"}).status_code == 200
    assert admin_client.get(changelist, {"kind__exact": "digest"}).status_code == 200
    change = reverse("admin:notifications_emailnotification_change", args=[row.pk])
    admin_client.post(change, {"status": "pending", "ses_message_id": ""})
    row.refresh_from_db()
    assert row.status == "sent"  # nothing editable
    assert admin_client.get(reverse("admin:notifications_emailnotification_add")).status_code == 403


MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


Status = EmailNotification.Status


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


def test_retrying_a_failed_digest_while_another_is_unsent_reports_instead_of_500(
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


def test_retry_needs_the_change_permission(make_pi, client):
    """R5: retry is offered to, and runs for, users with the change permission only."""
    row = _digest(make_pi(rung="daily"), Status.FAILED)
    viewer = baker.make("auth.User", username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_emailnotification"))
    client.force_login(viewer)
    url = reverse("admin:notifications_emailnotification_changelist")
    assert "retry_failed" not in client.get(url).content.decode()
    client.post(url, {"action": "retry_failed", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.status == Status.FAILED


def _suppressed(address: str = "gone@example.net"):
    from django.utils import timezone

    from notifications.suppression import feedback_record

    feedback_record(
        address=address, kind="hard_bounce", source="dsn", report="5.1.1", now=timezone.now()
    )
    from notifications.models import Suppression

    return Suppression.objects.get(address=address)


def test_unsuppress_needs_its_permission_and_is_logged(client):
    """Issue 23: the suppression list is read-only; unsuppress is offered to, and runs for,
    holders of notifications.unsuppress only, and each lift is in the row's history."""
    from django.contrib.admin.models import LogEntry

    from notifications.suppression import address_is_suppressed

    row = _suppressed()
    url = reverse("admin:notifications_suppression_changelist")
    staff = baker.make("auth.User", username="viewer", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_suppression"))
    client.force_login(staff)
    page = client.get(url).content.decode()
    assert "gone@example.net" in page and "unsuppress" not in page
    client.post(url, {"action": "unsuppress", "_selected_action": [row.pk]})
    assert address_is_suppressed("gone@example.net", now=row.suppressed_at)

    staff.user_permissions.add(Permission.objects.get(codename="unsuppress"))
    client.force_login(staff)  # a fresh permission cache
    assert "unsuppress" in client.get(url).content.decode()
    response = client.post(url, {"action": "unsuppress", "_selected_action": [row.pk]}, follow=True)
    assert response.status_code == 200
    row.refresh_from_db()
    assert row.lifted_at is not None and row.lifted_by == "viewer"
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert entry.user == staff and "Unsuppressed" in entry.get_change_message()


def test_the_changelist_never_loads_the_last_error(make_pi, admin_client):
    """Issue 22: the list never reads a notification's last error (its own page does)."""
    baker.make(EmailNotification, user=make_pi(), kind="digest", last_error="x" * 5000)
    url = reverse("admin:notifications_emailnotification_changelist")
    table = EmailNotification._meta.db_table
    assert columns_read(admin_client, url, table, ["last_error"]) == set()


def test_an_operator_suppresses_an_address_by_hand_and_it_is_logged(client, caplog):
    """Issue 31.6: an address could not be suppressed by hand (a PI asking by phone to stop
    the mail). It needs the add permission; the row, the admin's history and the log name who
    did it; the sweeps then skip the address."""
    from django.contrib.admin.models import ADDITION, LogEntry

    from notifications.models import Suppression
    from notifications.suppression import address_is_suppressed

    add = reverse("admin:notifications_suppression_add")
    staff = baker.make("auth.User", username="ops-anna", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_suppression"))
    client.force_login(staff)
    assert client.get(add).status_code == 403

    staff.user_permissions.add(Permission.objects.get(codename="add_suppression"))
    client.force_login(staff)
    assert client.get(add).status_code == 200
    with caplog.at_level("WARNING", logger="notifications.suppression"):
        response = client.post(add, {"address": " PI@Example.org ", "note": "asked by phone"})
    assert response.status_code == 302
    row = Suppression.objects.get()
    assert (row.address, row.reason, row.suppressed_by) == ("pi@example.org", "manual", "ops-anna")
    assert row.source_report == "asked by phone" and row.expires_at is None
    assert address_is_suppressed("pi@example.org", now=row.suppressed_at)
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert (entry.user, entry.action_flag) == (staff, ADDITION)
    (record,) = [r for r in caplog.records if getattr(r, "action", "") == "address_suppressed"]
    assert record.user == "ops-anna" and record.reason == "manual"
    assert "pi@example.org" not in record.getMessage()  # addresses are redacted in logs
    changelist = client.get(reverse("admin:notifications_suppression_changelist"))
    assert "ops-anna" in changelist.content.decode()


def test_a_hand_suppression_refuses_a_bad_or_already_suppressed_address(admin_client):
    from notifications.models import Suppression

    add = reverse("admin:notifications_suppression_add")
    for address in ("not an address", "a@example.org\r\nBcc: b@example.org", ""):
        response = admin_client.post(add, {"address": address, "note": ""})
        assert response.status_code == 200 and response.context["adminform"].form.errors
    assert not Suppression.objects.exists()

    row = _suppressed()
    response = admin_client.post(add, {"address": row.address, "note": "again"})
    assert response.status_code == 200
    assert "already suppressed" in response.content.decode()
    row.refresh_from_db()
    assert row.reason == "hard_bounce"  # the bounce's record is kept as it was
