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


class _WritesMarker:
    """A pickle that runs `touch marker` when it is unpickled."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _pickled(value) -> str:
    import base64
    import pickle

    return base64.b64encode(pickle.dumps(value)).decode()


def _insert_task_row(task_id: str, *, success: bool, args: str, result: str) -> None:
    """A django_q_task row written by SQL, as a role other than the worker's could."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_q_task (id, name, func, args, kwargs, result, started, stopped, "
            "success, attempt_count) VALUES (%s, %s, 'jobs.tasks.reap_stale_jobs', %s, %s, %s, "
            "now(), now(), %s, 1)",
            [task_id, f"task-{task_id}", args, _pickled({}), result, success],
        )


@pytest.mark.parametrize("success", [True, False])
def test_the_task_admin_never_unpickles_what_it_cannot_trust(admin_client, tmp_path, success):
    """Issue 19 (trust boundaries): django-q2 stores a task's args, kwargs and result as
    unsigned pickles; showing a row written by SQL must not run the code in it."""
    from django_q.models import OrmQ, Task

    marker = tmp_path / "unpickled"
    hostile = _pickled(_WritesMarker(marker))
    _insert_task_row("a" * 32, success=success, args=hostile, result=hostile)
    _insert_task_row("b" * 32, success=success, args=_pickled(()), result=_pickled({"done": 3}))
    model = "success" if success else "failure"

    listing = admin_client.get(reverse(f"admin:django_q_{model}_changelist"))
    assert listing.status_code == 200
    hostile_page = admin_client.get(reverse(f"admin:django_q_{model}_change", args=["a" * 32]))
    assert hostile_page.status_code == 200
    assert "not shown: posix.system is not plain data" in hostile_page.content.decode()
    plain_page = admin_client.get(reverse(f"admin:django_q_{model}_change", args=["b" * 32]))
    assert "{&#x27;done&#x27;: 3}" in plain_page.content.decode()

    response = admin_client.post(
        reverse(f"admin:django_q_{model}_changelist"),
        {"action": "resubmit_task", "_selected_action": ["a" * 32]},
        follow=True,
    )
    assert "not resubmitted" in response.content.decode()
    assert not OrmQ.objects.exists()
    assert Task.objects.filter(pk="a" * 32).exists()  # a refused failure is kept, not deleted
    assert not marker.exists()

    admin_client.post(
        reverse(f"admin:django_q_{model}_changelist"),
        {"action": "resubmit_task", "_selected_action": ["b" * 32]},
    )
    assert [row.func() for row in OrmQ.objects.all()] == ["jobs.tasks.reap_stale_jobs"]
    assert Task.objects.filter(pk="b" * 32).exists() == success  # a failure is resubmitted
