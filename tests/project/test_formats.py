"""Issue 31, point 6: every date the admin shows reads ISO, UTC, with seconds
("2026-12-04 16:46:05 UTC"), the admin's own lists and forms included: never Django's
English default "Dec. 4, 2026, 4:46 p.m.", next to tables in ISO UTC."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.urls import reverse
from django.utils import formats
from model_bakery import baker

from jobs.models import Job
from processes.models import WorkerProcess

pytestmark = pytest.mark.django_db

WHEN = datetime(2026, 12, 4, 16, 46, 5, tzinfo=UTC)
SHOWN = "2026-12-04 16:46:05 UTC"


def test_the_datetime_formats_are_iso_utc_with_seconds():
    assert formats.date_format(WHEN, "DATETIME_FORMAT") == SHOWN
    assert formats.date_format(WHEN, "SHORT_DATETIME_FORMAT") == SHOWN
    assert formats.date_format(WHEN.date(), "DATE_FORMAT") == "2026-12-04"
    assert formats.time_format(WHEN.time(), "TIME_FORMAT") == "16:46:05"


def test_a_changelist_shows_iso_dates(admin_client):
    baker.make(
        WorkerProcess,
        role="qcluster",
        host="h",
        pid=1,
        started_at=WHEN,
        heartbeat_at=WHEN,
        gone_after=WHEN,
        interval_seconds=10,
    )
    html = admin_client.get(reverse("admin:processes_workerprocess_changelist")).content.decode()
    assert SHOWN in html
    assert "p.m." not in html and "Dec. 4" not in html


def test_a_change_page_shows_iso_dates(admin_client):
    job = baker.make(
        Job, kind="k", status="failed", max_attempts=1, failed_at=WHEN, last_error="E: x"
    )
    html = admin_client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    assert SHOWN in html
    assert "p.m." not in html and "Dec. 4" not in html
