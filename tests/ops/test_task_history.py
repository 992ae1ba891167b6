"""django-q2's task history is capped (issue 21): successes by save_limit, and results of
either kind (failures, which django-q2 never caps) by the hourly prune."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Schedule, Task
from model_bakery import baker

from ops.task_history import task_history_prune
from ops.tasks import prune_task_history

pytestmark = pytest.mark.django_db


def _task(*, success: bool, days_ago: float) -> Task:
    stopped = timezone.now() - timedelta(days=days_ago)
    return baker.make(
        Task,
        id=baker.random_gen.gen_string(32),
        func="inbound_email.tasks.poll_inbound_email",
        success=success,
        started=stopped - timedelta(seconds=1),
        stopped=stopped,
    )


def test_old_failures_and_successes_are_pruned_young_ones_kept():
    old = [_task(success=False, days_ago=31) for _ in range(3)] + [_task(success=True, days_ago=40)]
    young = [_task(success=False, days_ago=1), _task(success=True, days_ago=29)]
    assert prune_task_history() == len(old)
    assert set(Task.objects.values_list("id", flat=True)) == {t.id for t in young}


def test_the_task_retention_is_a_setting_and_the_prune_runs_in_batches(settings):
    settings.Q_TASK_RETENTION_DAYS = 2
    for _ in range(7):
        _task(success=False, days_ago=3)
    kept = _task(success=False, days_ago=1)
    assert task_history_prune(batch_size=3) == 7
    assert list(Task.objects.values_list("id", flat=True)) == [kept.id]


def test_successes_are_capped_by_django_q2s_save_limit():
    assert settings.Q_CLUSTER["save_limit"] >= 1  # 0 would mean "keep every success"


def test_the_prune_is_scheduled_hourly():
    call_command("setup_schedules")
    assert Schedule.objects.get(func="ops.tasks.prune_task_history").minutes == 60
