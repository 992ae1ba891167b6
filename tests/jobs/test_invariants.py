"""I3 and I5 over random mixes of outcomes (hypothesis, bounded).

Runs on a transactional test database with no outer atomic block: each handler's
transaction is a real transaction that really commits or rolls back (inside an outer block it
would only be a savepoint, and a commit on an aborted transaction could not show up).
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import enqueue, run_pending
from jobs.models import Job

User = get_user_model()
OUTCOMES = st.sampled_from(["ok", "error", "db_error", "permanent", "invalid"])


def _clean() -> None:
    # transaction=True flushes once per test function, not per hypothesis example.
    Job.objects.all().delete()
    User.objects.filter(username__regex=r"^(s|dup)-").delete()


@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(jobs=st.lists(st.tuples(OUTCOMES, st.integers(1, 3)), min_size=1, max_size=8))
def test_no_row_is_left_processing_and_attempts_never_exceed_max(jobs):
    assert not connection.in_atomic_block  # handler transactions are real transactions
    _clean()
    try:
        with transaction.atomic():
            for n, (outcome, max_attempts) in enumerate(jobs):
                enqueue("tests.scripted", {"n": n, "outcome": outcome}, max_attempts=max_attempts)
        for _ in range(4):  # enough passes to exhaust max_attempts=3
            Job.objects.filter(status=Job.Status.QUEUED).update(run_after=timezone.now())
            run_pending()
            rows = list(Job.objects.all())
            assert all(row.status != Job.Status.PROCESSING for row in rows)
            assert all(row.attempts <= row.max_attempts for row in rows)
            for row in rows:
                assert (row.completed_at is not None) == (row.status == Job.Status.COMPLETED)
                assert (row.failed_at is not None) == (row.status == Job.Status.FAILED)
                assert row.locked_by == "" and row.lease_expires_at is None
        final = {row.payload["n"]: row for row in Job.objects.all()}
        assert len(final) == len(jobs)
        for n, (outcome, max_attempts) in enumerate(jobs):
            row = final[n]
            if outcome == "ok":
                assert (row.status, row.attempts) == (Job.Status.COMPLETED, 1)
            elif outcome in {"permanent", "invalid"}:
                assert (row.status, row.attempts) == (Job.Status.FAILED, 1)
            else:
                assert (row.status, row.attempts) == (Job.Status.FAILED, max_attempts)
            # I3: a handler's writes are committed exactly when its job completed
            committed = User.objects.filter(username__startswith=f"s-{n}-").count()
            assert committed == (1 if outcome == "ok" else 0), (n, outcome)
        assert not User.objects.filter(username__startswith="dup-").exists()
    finally:
        _clean()
