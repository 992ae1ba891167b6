"""Admin actions and permissions, across every registered ModelAdmin (issue 10).

A view-only staff user could run "Restore rung" (it re-subscribes users who paused) and
django-q2's "Resubmit selected tasks to queue". Every action that writes must declare the
permission it needs (`allowed_permissions`), and a view-only user running any action through
the changelist must change no row anywhere.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.test import RequestFactory
from django.urls import reverse
from model_bakery import baker

from notifications.models import NotificationPreference

pytestmark = pytest.mark.django_db

# Rows in the states the actions act on, so that an action that runs does write.
ROW_STATES: dict[str, dict[str, Any]] = {
    "notifications.NotificationPreference": {"rung": "paused", "consecutive_missed": 2},
    "notifications.EmailNotification": {"status": "failed", "attempts": 5},
    "jobs.Job": {"status": "failed", "attempts": 1},
    "inbound_email.InboundEmail": {"status": "quarantined", "raw": b"Subject: x\r\n\r\nhi"},
    "inbound_email.Reply": {"needs_operator": True},
    "django_q.Success": {"success": True, "func": "math.floor", "args": (1.5,)},
    "django_q.Failure": {"success": False, "func": "math.floor", "args": (1.5,)},
}
# The actions that write, which the walk must reach (so it cannot pass by walking nothing).
WRITING_ACTIONS = {
    ("notifications.NotificationPreference", "restore_rung"),
    ("notifications.EmailNotification", "retry_failed"),
    ("jobs.Job", "retry_now"),
    ("jobs.Job", "cancel"),
    ("inbound_email.InboundEmail", "reprocess"),
    ("inbound_email.InboundEmail", "discard"),
    ("inbound_email.Reply", "acknowledge"),
    ("django_q.Success", "resubmit_task"),
    ("django_q.Failure", "resubmit_task"),
}


def _superuser_request(django_user_model):
    request = RequestFactory().get("/admin/")
    request.user = django_user_model(username="root", is_staff=True, is_superuser=True)
    return request


def all_actions(django_user_model) -> list[tuple[type, admin.ModelAdmin, str, Any]]:
    """(model, admin, name, function) of every action of every registered ModelAdmin."""
    request = _superuser_request(django_user_model)
    found = []
    for model, model_admin in admin.site._registry.items():
        for name, (func, _, _) in model_admin.get_actions(request).items():
            found.append((model, model_admin, name, func))
    return found


def _value(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def snapshot() -> dict[str, list[tuple]]:
    """Every row of every table (sessions aside: the test client's own bookkeeping)."""
    return {
        model._meta.label: sorted(
            (tuple(map(_value, row)) for row in model._default_manager.values_list()), key=repr
        )
        for model in apps.get_models()
        if model is not Session and not model._meta.proxy
    }


def make_rows(model: type) -> list[Any]:
    return baker.make(model, _quantity=2, **ROW_STATES.get(model._meta.label, {}))


@pytest.fixture
def view_only_client(client, django_user_model):
    user = django_user_model.objects.create_user(username="viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client.force_login(user)
    return client


def post_action(client, model: type, name: str, pks: list[Any]):
    opts = model._meta
    return client.post(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"),
        {"action": name, ACTION_CHECKBOX_NAME: [str(pk) for pk in pks], "index": "0"},
    )


def test_every_admin_action_declares_the_permission_it_needs(django_user_model):
    undeclared = [
        f"{model._meta.label}.{name}"
        for model, _, name, func in all_actions(django_user_model)
        if not getattr(func, "allowed_permissions", None)
    ]
    assert undeclared == []


def test_a_view_only_user_running_every_action_changes_no_row(view_only_client, django_user_model):
    actions = all_actions(django_user_model)
    walked = {(model._meta.label, name) for model, _, name, _ in actions}
    assert walked >= WRITING_ACTIONS
    rows = {model: make_rows(model) for model in {model for model, *_ in actions}}
    before = snapshot()

    for model, _, name, _ in actions:
        response = post_action(view_only_client, model, name, [row.pk for row in rows[model]])
        assert response.status_code in (200, 302, 403), (model, name)

    assert snapshot() == before


def test_a_user_with_the_change_permission_can_restore_a_rung(client, django_user_model):
    """The control of the walk above: the same POST by a user allowed to change the model
    does write, so "no row changed" means refused, not a request that never reached it."""
    user = django_user_model.objects.create_user(username="operator", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            codename__in=["view_notificationpreference", "change_notificationpreference"]
        )
    )
    client.force_login(user)
    paused = make_rows(NotificationPreference)

    post_action(client, NotificationPreference, "restore_rung", [p.pk for p in paused])

    for preference in paused:
        preference.refresh_from_db()
        assert (preference.rung, preference.consecutive_missed) == ("immediate", 0)
