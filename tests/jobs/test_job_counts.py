"""The trigger-kept (kind, status) counts always equal a GROUP BY over the rows (issue 20:
the health page and the job list read counts without scanning a million rows)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone
from model_bakery import baker

from jobs import enqueue
from jobs.models import Job
from jobs.operator_actions import jobs_cancel, jobs_prune_completed
from jobs.runner import run_pending
from jobs.selectors import job_counts_by_kind, job_status_counts

pytestmark = pytest.mark.django_db


def _truth() -> dict[str, dict[str, int]]:
    by_kind: dict[str, dict[str, int]] = {}
    for row in Job.objects.values("kind", "status").annotate(n=Count("id")).order_by():
        by_kind.setdefault(row["kind"], {})[row["status"]] = row["n"]
    return dict(sorted(by_kind.items()))


def test_counts_follow_every_kind_of_write():
    # The counts are the whole table's: the test makes the table its own first (inside its
    # transaction, rolled back at the end), so rows another test or an interrupted run left
    # committed are neither counted nor run by the drain below (issue 36: 2,005 completed).
    Job.objects.all().delete()
    assert set(job_status_counts().values()) == {0}
    for i in range(5):
        enqueue("tests.noop", {"i": i})
    enqueue("tests.boom", max_attempts=1)
    later = timezone.now() + timedelta(hours=1)  # not due: the drain leaves them queued
    baker.make(
        Job, kind="bulk.kind", max_attempts=3, run_after=later, _quantity=30, _bulk_create=True
    )
    assert job_counts_by_kind() == _truth()

    run_pending()  # claims (a batch UPDATE), completions, a failure
    assert job_counts_by_kind() == _truth()
    assert job_status_counts()["completed"] == 5 and job_status_counts()["failed"] == 1

    first_ten = Job.objects.filter(kind="bulk.kind").order_by("pk").values("pk")[:10]
    assert jobs_cancel(jobs=Job.objects.filter(pk__in=first_ten)) == 10
    with connection.cursor() as cursor:  # another producer's plain SQL
        cursor.execute(
            "UPDATE jobs_job SET kind = 'renamed' WHERE kind = 'bulk.kind' AND id % 2 = 0"
        )
        cursor.execute("UPDATE jobs_job SET heartbeat_at = now()")  # no status change
        cursor.execute("DELETE FROM jobs_job WHERE kind = 'renamed' AND status = 'queued'")
    jobs_prune_completed(older_than_days=-1)
    assert job_counts_by_kind() == _truth()
    assert "completed" not in job_counts_by_kind().get("tests.noop", {})

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_job CASCADE")
    assert job_counts_by_kind() == {} and set(job_status_counts().values()) == {0}
