"""Issue 19.1: in the admin, a schedule's function cannot be set or edited."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django_q.models import Schedule

from ops.schedules import SCHEDULES, ensure_schedules

pytestmark = pytest.mark.django_db


def test_the_admin_adds_no_schedule(admin_client):
    assert admin_client.get(reverse("admin:django_q_schedule_add")).status_code == 403
    response = admin_client.post(
        reverse("admin:django_q_schedule_add"),
        {"name": "hostile", "func": "os.system", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )
    assert response.status_code == 403
    assert not Schedule.objects.filter(name="hostile").exists()


def test_a_schedules_function_hook_and_arguments_cannot_be_edited(admin_client):
    ensure_schedules()
    schedule = Schedule.objects.get(name=SCHEDULES[0].name)
    url = reverse("admin:django_q_schedule_change", args=[schedule.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="func"' not in page and 'name="hook"' not in page
    assert SCHEDULES[0].func in page  # shown, read-only

    response = admin_client.post(
        url,
        {
            "name": schedule.name,
            "func": "os.system",
            "hook": "os.system",
            "args": "'touch /tmp/x'",
            "schedule_type": "I",
            "minutes": 1,
            "repeats": -1,
            "next_run_0": "2030-01-01",
            "next_run_1": "00:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.func, schedule.hook, schedule.args) == (SCHEDULES[0].func, None, None)
