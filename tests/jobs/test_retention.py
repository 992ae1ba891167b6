"""Retention per state (issue 38, point 6): completed, failed and cancelled jobs each have
their retention; pruning deletes in short batches and records what it pruned, which the
health page shows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from jobs.conf import get_config
from jobs.models import Job, JobPruneRun, JobUniqueKey
from jobs.pruning import jobs_prune
from jobs.tasks import prune_completed_jobs

pytestmark = pytest.mark.django_db


def _finished(status: str, days_ago: float, quantity: int = 1) -> list[Job]:
    at = timezone.now() - timedelta(days=days_ago)
    stamp = {"completed": "completed_at", "failed": "failed_at", "cancelled": "cancelled_at"}
    return baker.make(
        Job,
        kind="k",
        status=status,
        attempts=1,
        max_attempts=1,
        _quantity=quantity,
        **{stamp[status]: at},
    )


def test_each_state_has_its_retention_with_defaults(settings):
    config = get_config()
    assert (config.retention_days, config.failed_retention_days) == (14, 30)
    assert config.cancelled_retention_days == 30
    settings.JOBS_FAILED_RETENTION_DAYS = -1
    with pytest.raises(ImproperlyConfigured, match="JOBS_FAILED_RETENTION_DAYS"):
        get_config()


def test_prune_deletes_each_state_past_its_own_retention(settings):
    settings.JOBS_RETENTION_DAYS = 7
    settings.JOBS_FAILED_RETENTION_DAYS = 20
    settings.JOBS_CANCELLED_RETENTION_DAYS = 3
    gone = [
        *_finished("completed", 8, 2),
        *_finished("failed", 21, 3),
        *_finished("cancelled", 4, 1),
    ]
    kept = [
        *_finished("completed", 6),
        *_finished("failed", 19),
        *_finished("cancelled", 2),
        baker.make(Job, kind="k", status="queued", max_attempts=1),
    ]
    result = jobs_prune(batch=2)
    assert (result.completed, result.failed, result.cancelled) == (2, 3, 1)
    assert set(Job.objects.values_list("pk", flat=True)) == {job.pk for job in kept}
    assert not Job.objects.filter(pk__in=[job.pk for job in gone]).exists()


def test_prune_deletes_in_short_transactions_of_at_most_a_batch(settings):
    settings.JOBS_FAILED_RETENTION_DAYS = 1
    _finished("failed", 2, 7)
    with CaptureQueriesContext(connection) as queries:
        assert jobs_prune(batch=3).failed == 7
    deletes = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("DELETE")]
    deletes_of_jobs = [sql for sql in deletes if "jobs_job" in sql and "LIMIT 3" in sql]
    assert len(deletes_of_jobs) >= 3  # 3 + 3 + 1 (then one that finds none)


def test_expired_unique_keys_are_pruned_and_live_ones_kept():
    now = timezone.now()
    JobUniqueKey.objects.create(kind="k", unique_key="old", job_id=1, expires_at=now)
    JobUniqueKey.objects.create(
        kind="k", unique_key="new", job_id=2, expires_at=now + timedelta(hours=1)
    )
    assert jobs_prune().unique_keys == 1
    assert list(JobUniqueKey.objects.values_list("unique_key", flat=True)) == ["new"]


def test_each_prune_is_recorded_and_the_task_returns_the_total(settings):
    settings.JOBS_RETENTION_DAYS = 1
    _finished("completed", 2, 2)
    assert prune_completed_jobs() == 2
    run = JobPruneRun.objects.get()
    assert (run.completed, run.failed, run.cancelled, run.unique_keys) == (2, 0, 0, 0)


def test_the_health_page_says_what_pruning_deleted(admin_client, settings):
    settings.JOBS_RETENTION_DAYS = 1
    settings.JOBS_FAILED_RETENTION_DAYS = 1
    _finished("completed", 2, 3)
    _finished("failed", 2, 1)
    prune_completed_jobs()
    page = admin_client.get(reverse("ops:worker_health")).content.decode()
    assert "Pruning" in page
    assert "3 completed, 1 failed, 0 cancelled" in page
