"""Issue 37, point 4: a runner step that completes jobs and claims others updates jobs_job
once, so the table's statement triggers (history, counts, rates and histograms, wake-up)
fire once for both instead of once each (migration jobs/0027).

The firings are counted by a statement trigger of the test's own, added inside the test's
transaction (rolled back with it): PostgreSQL fires it exactly as it fires the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import enqueue
from jobs.models import Job, JobAttempt
from jobs.runner_step import job_runner_step
from jobs.selectors import job_status_counts
from ops.job_periods import period_totals

pytestmark = pytest.mark.django_db

_COUNTER = """
CREATE FUNCTION tests_count_job_statements() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('tests.job_statements',
        (coalesce(nullif(current_setting('tests.job_statements', true), ''), '0')::int + 1)::text,
        false);
    RETURN NULL;
END $$;
CREATE TRIGGER tests_count_job_statements AFTER UPDATE ON jobs_job
    FOR EACH STATEMENT EXECUTE FUNCTION tests_count_job_statements();
"""


@pytest.fixture
def update_statements() -> Iterator[Callable[[], int]]:
    """How many UPDATE statements on jobs_job fired their statement triggers since the
    last call (the counter is reset by each call)."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNTER)

    def fired() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('tests.job_statements', true)")
            (value,) = cursor.fetchone()
            cursor.execute("SELECT set_config('tests.job_statements', '0', false)")
        return int(value or 0)

    fired()
    yield fired


def test_a_step_completing_and_claiming_fires_the_statement_triggers_once(update_statements):
    first = [enqueue("tests.noop") for _ in range(3)]
    waiting = [enqueue("tests.noop") for _ in range(3)]
    step = job_runner_step(worker="w", claim=3)
    assert [job.id for job in step.claimed] == [job.pk for job in first]
    assert update_statements() == 1

    step = job_runner_step(
        worker="w", done=[(job.pk, 0.01) for job in first], claim=3, want_more=True
    )

    assert update_statements() == 1
    assert step.completed == {job.pk for job in first}
    assert [job.id for job in step.claimed] == [job.pk for job in waiting]
    assert [job.attempts for job in step.claimed] == [1, 1, 1]
    assert not step.more_due
    for job in first:
        job.refresh_from_db()
        assert job.status == Job.Status.COMPLETED and job.locked_by == ""
        assert job.started_at is not None and job.started_at <= job.completed_at
        assert job.lease_expires_at is None and job.attempts == 1
    for job in waiting:
        job.refresh_from_db()
        assert job.status == Job.Status.PROCESSING and job.locked_by == "w"
        assert job.started_at is None and job.completed_at is None
        assert job.lease_expires_at is not None and job.attempts == 1
    # What the triggers made of the one statement, as of two: each finished attempt once,
    # the counts and the per-kind periods exact.
    attempts = JobAttempt.objects.filter(job_id__in=[job.pk for job in first])
    assert sorted(a.outcome for a in attempts) == ["completed"] * 3
    assert not JobAttempt.objects.filter(job_id__in=[job.pk for job in waiting]).exists()
    counts = job_status_counts()
    assert (counts["completed"], counts["processing"], counts["queued"]) == (3, 3, 0)
    totals = period_totals(since=timezone.now() - timedelta(hours=1))["tests.noop"]
    assert totals.completed == 3 and totals.failed == totals.retried == 0
    assert sum(totals.durations) == 3 and sum(totals.waits) == 3


def test_a_step_whose_completions_are_not_ours_claims_all_the_same(update_statements):
    """A completion the reaper took away (another worker's row now) is not completed; the
    claim in the same statement is unaffected."""
    taken = enqueue("tests.noop")
    job_runner_step(worker="other", claim=1)
    waiting = enqueue("tests.noop")
    update_statements()

    step = job_runner_step(worker="w", done=[(taken.pk, 0.01)], claim=1)

    assert update_statements() == 1
    assert step.completed == frozenset()
    assert [job.id for job in step.claimed] == [waiting.pk]
    taken.refresh_from_db()
    assert taken.status == Job.Status.PROCESSING and taken.locked_by == "other"


def test_a_step_with_only_completions_fires_them_once(update_statements):
    job = enqueue("tests.noop")
    job_runner_step(worker="w", claim=1)
    update_statements()

    step = job_runner_step(worker="w", done=[(job.pk, 0.01)])

    assert update_statements() == 1
    assert step.completed == {job.pk} and step.claimed == []
