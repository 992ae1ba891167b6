"""jobs.selectors: the one home of "stuck", "due" and the finished-per-minute series."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from model_bakery import baker

from jobs.models import Job
from jobs.selectors import (
    job_counts_by_kind,
    job_oldest_due,
    jobs_finished_per_bucket,
    jobs_stuck,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 12, 0, 30, tzinfo=UTC)


def _job(**fields) -> Job:
    return baker.make(Job, kind=fields.pop("kind", "report.render"), max_attempts=5, **fields)


def test_stuck_means_processing_with_an_expired_lease_and_nothing_else():
    stuck = _job(status="processing", lease_expires_at=NOW - timedelta(seconds=1))
    _job(status="processing", lease_expires_at=NOW + timedelta(seconds=30))  # still leased
    _job(status="queued", lease_expires_at=NOW - timedelta(hours=1))  # not processing
    assert list(jobs_stuck(now=NOW)) == [stuck]


def test_oldest_due_ignores_future_and_non_queued_rows():
    assert job_oldest_due(now=NOW) is None
    _job(status="queued", run_after=NOW + timedelta(seconds=5))
    _job(status="failed", run_after=NOW - timedelta(hours=2))
    newer = _job(status="queued", run_after=NOW - timedelta(seconds=10))
    older = _job(status="queued", run_after=NOW - timedelta(seconds=60))
    assert job_oldest_due(now=NOW) == older
    assert newer.pk


def test_counts_by_kind_lists_only_the_statuses_each_kind_has():
    _job(kind="b.kind", status="queued")
    _job(kind="a.kind", status="failed")
    _job(kind="a.kind", status="failed")
    _job(kind="a.kind", status="completed", completed_at=NOW)
    assert job_counts_by_kind() == {
        "a.kind": {"completed": 1, "failed": 2},
        "b.kind": {"queued": 1},
    }


def test_finished_per_bucket_buckets_completed_and_permanently_failed_rows():
    minute = NOW.replace(second=0)
    _job(status="completed", completed_at=minute + timedelta(seconds=5))
    _job(status="completed", completed_at=minute + timedelta(seconds=59))
    _job(status="completed", completed_at=minute - timedelta(seconds=1))
    _job(status="failed", failed_at=minute + timedelta(seconds=2))
    _job(status="completed", completed_at=NOW - timedelta(hours=25))  # before the window
    # a retried attempt (back to queued) is not a failure
    _job(status="queued", failed_at=None, last_error="boom")

    series = jobs_finished_per_bucket(since=NOW - timedelta(hours=24), step=timedelta(minutes=1))

    assert series["completed"] == {minute: 2, minute - timedelta(minutes=1): 1}
    assert series["failed"] == {minute: 1}


def test_finished_per_bucket_counts_30_minute_buckets_from_utc_midnight():
    """The 24 h range's bars (issue 20): 30-minute buckets starting on the hour and half hour
    in UTC, whatever the session time zone."""
    half = NOW.replace(minute=0 if NOW.minute < 30 else 30, second=0, microsecond=0)
    _job(status="completed", completed_at=half)
    _job(status="completed", completed_at=half + timedelta(minutes=29, seconds=59))
    _job(status="completed", completed_at=half - timedelta(seconds=1))

    series = jobs_finished_per_bucket(since=NOW - timedelta(hours=24), step=timedelta(minutes=30))

    assert series["completed"] == {half: 2, half - timedelta(minutes=30): 1}
