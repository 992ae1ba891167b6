"""Operators see timeouts and cancellations of the last hour, per kind (issue 37, point 10):
worker_status (text and --json), the health page and /metrics (label: kind)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import tests.jobs.stop_handlers  # noqa: F401 - registers the handlers below
from jobs import enqueue, run_pending
from jobs.models import Job, JobStop
from jobs.operator_actions import jobs_cancel
from jobs.runner_step import job_claim_batch
from jobs.stops import STOP_CANCEL, job_record_stopped

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stopped_jobs():
    """One real timeout (an async handler cancelled past its 0.5 s), one real cancel of a
    running job, and a timeout of two hours ago that no longer counts."""
    enqueue("tests.stop.async_sleeps", {"name": "v"}, max_attempts=3)
    assert run_pending().timed_out == 1
    job = enqueue("tests.stop.quick", {"name": "c"})
    [claimed] = job_claim_batch(worker="w", limit=1)
    assert jobs_cancel(jobs=Job.objects.filter(pk=job.pk)) == 1
    assert job_record_stopped(job=claimed, worker="w", reason=STOP_CANCEL) == "cancelled"
    old = JobStop.objects.create(job_id=1, attempt=1, kind="tests.stop.quick", reason="timeout")
    JobStop.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(hours=2))


def test_worker_status_shows_the_last_hours_timeouts_and_cancellations(capsys, stopped_jobs):
    call_command("worker_status")
    out = capsys.readouterr().out
    assert "STOPPED (last hour): tests.stop.async_sleeps 1 timed out, 0 cancelled" in out
    assert "STOPPED (last hour): tests.stop.quick 0 timed out, 1 cancelled" in out
    call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["jobs_stopped_last_hour"] == {
        "tests.stop.async_sleeps": {"timeout": 1, "cancel": 0},
        "tests.stop.quick": {"timeout": 0, "cancel": 1},
    }


def test_the_health_page_shows_them(admin_client, stopped_jobs):
    health = admin_client.get(reverse("ops:worker_health")).content.decode()
    assert 'id="job-stops"' in health
    part = health.split('id="job-stops"', 1)[1].split("</p>", 1)[0]
    assert "tests.stop.async_sleeps</a> 1 timed out, 0 cancelled" in part
    assert "tests.stop.quick</a> 0 timed out, 1 cancelled" in part


def test_metrics_export_them_by_kind(client, settings, stopped_jobs):
    settings.METRICS_TOKEN = "t"
    body = client.get("/metrics", headers={"Authorization": "Bearer t"}).content.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    timeouts, cancels = (
        {s.labels["kind"]: s.value for s in families[name].samples}
        for name in ("worker_job_timeouts_last_hour", "worker_job_cancellations_last_hour")
    )
    assert timeouts == {"tests.stop.async_sleeps": 1, "tests.stop.quick": 0}
    assert cancels == {"tests.stop.async_sleeps": 0, "tests.stop.quick": 1}
    for family in ("worker_job_timeouts_last_hour", "worker_job_cancellations_last_hour"):
        assert all(set(s.labels) == {"kind"} for s in families[family].samples)


def test_the_daily_prune_drops_stop_rows_older_than_a_day(stopped_jobs):
    from jobs.tasks import prune_completed_jobs

    day_old = JobStop.objects.create(job_id=2, attempt=1, kind="tests.stop.quick", reason="cancel")
    JobStop.objects.filter(pk=day_old.pk).update(at=timezone.now() - timedelta(days=2))
    prune_completed_jobs()
    assert not JobStop.objects.filter(pk=day_old.pk).exists()
    assert JobStop.objects.count() == 3  # the hour's two and the two-hour-old one stay
