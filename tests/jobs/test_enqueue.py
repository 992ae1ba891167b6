"""enqueue() joins the caller's transaction; the wake-up (the table trigger's NOTIFY) leaves
only after commit."""

from __future__ import annotations

import pytest
from django.db import transaction

from jobs import enqueue, run_pending
from jobs.models import Job
from tests.support.wakeup import listening


@pytest.fixture
def wakeups():
    """The wake-up notifications sent since the last call."""
    with listening() as received:
        yield received


@pytest.mark.django_db(transaction=True)
def test_job_enqueued_in_a_rolled_back_transaction_never_runs(tmp_path, wakeups):
    log = tmp_path / "runs.log"

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        enqueue("tests.log", {"n": 1, "log": str(log)})
        raise Abort

    assert Job.objects.count() == 0
    assert wakeups(0.5) == []  # no wake-up either
    assert run_pending().claimed == 0
    assert not log.exists()


@pytest.mark.django_db(transaction=True)
def test_one_wakeup_per_committed_transaction_and_none_before_commit(tmp_path, wakeups):
    with transaction.atomic():
        for n in range(50):
            enqueue("tests.log", {"n": n, "log": str(tmp_path / "log")})
        assert wakeups(0.3) == []  # not before commit
    assert wakeups() == ["jobs_job_due"]

    enqueue("tests.noop")  # autocommit: its own transaction, its own wake-up
    assert wakeups() == ["jobs_job_due"]


@pytest.mark.django_db(transaction=True)
def test_a_wakeup_registered_in_a_rolled_back_savepoint_is_replaced(wakeups):
    with transaction.atomic():
        try:
            with transaction.atomic():
                enqueue("tests.noop")
                raise ValueError
        except ValueError:
            pass
        enqueue("tests.noop")
    assert wakeups() == ["jobs_job_due"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_enqueue_validates_its_arguments():
    with pytest.raises(TypeError):
        enqueue("tests.noop", ["not", "a", "dict"])
    with pytest.raises(ValueError):
        enqueue("tests.noop", max_attempts=0)
    job = enqueue("tests.noop", priority=3)
    assert (job.status, job.attempts, job.priority) == (Job.Status.QUEUED, 0, 3)
    assert job.max_attempts == 5  # JOBS_DEFAULT_MAX_ATTEMPTS
