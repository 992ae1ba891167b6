"""Entry points: the admin (read-only rows, restore action), run_sweeps, the scheduled tasks."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.urls import reverse

from notifications import tasks
from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_new_proposals
from ops.schedules import SCHEDULES

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


def test_run_sweeps_once_prints_summaries(make_pi, capsys):
    make_pi()
    call_command("run_sweeps", "--once")
    out = capsys.readouterr().out
    assert "new_proposal: users=1 sent=1 failed=0 expired=0" in out
    assert "proposal_review: users=1 sent=1" in out
    assert "digest: users=0 sent=0" in out
    call_command("run_sweeps", "--once", "--sweep", "digest")
    assert capsys.readouterr().out.startswith("digest: ")


def test_scheduled_task_paths_exist_and_return_summaries(make_pi):
    make_pi()
    paths = [spec.func for spec in SCHEDULES if spec.func.startswith("notifications.")]
    assert paths == [
        "notifications.tasks.new_proposal_sweep",
        "notifications.tasks.proposal_review_sweep",
        "notifications.tasks.digest_sweep",
    ]
    results = [getattr(tasks, path.rsplit(".", 1)[1])() for path in paths]
    assert [(r["sweep"], r["sent"]) for r in results] == [
        ("new_proposal", 1),
        ("proposal_review", 1),
        ("digest", 0),
    ]
