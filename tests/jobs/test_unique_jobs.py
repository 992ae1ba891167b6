"""Unique jobs (issue 38, point 1): while a job of a kind with a key is queued or processing
(and, when asked, for a period after it completed), a second enqueue with that key returns
the existing job, inserts nothing and raises nothing. The database decides: a producer that
meets another's uncommitted job waits for that transaction and inserts if it rolls back."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from jobs import enqueue
from jobs.models import Job, JobUniqueKey
from jobs.operator_actions import jobs_retry_now
from jobs.outcomes import job_complete, job_record_failure
from jobs.runner_step import job_claim_batch
from tests.support.sessions import other_session

LIVE_SQL = "SELECT job_id, inserted FROM jobs_enqueue_unique(%s, %s::jsonb, %s)"


def _run_in_thread(work):
    """Start `work` in a thread with its own Django connection; return (thread, result)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _waiting_for_a_lock(application_name: str = "", timeout: float = 10.0) -> bool:
    """Whether some backend of this database waits for a lock (the second producer)."""
    deadline = time.monotonic() + timeout
    with other_session() as watcher:
        watcher.autocommit = True
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            if waiting:
                return True
            time.sleep(0.02)
    return False


def _finish(job_id: int) -> None:
    claimed = job_claim_batch(worker="w", limit=10)
    assert [c.id for c in claimed] == [job_id]
    job_complete(job=claimed[0], worker="w")


@pytest.mark.django_db
def test_a_second_enqueue_with_the_key_returns_the_queued_job_and_inserts_nothing():
    first = enqueue("tests.noop", {"n": 1}, unique_key="draft:812")
    second = enqueue("tests.noop", {"n": 2}, unique_key="draft:812")
    assert second.pk == first.pk
    assert (first.was_inserted, second.was_inserted) == (True, False)
    assert second.payload == {"n": 1}  # the existing job, as it is
    assert Job.objects.count() == 1
    # another kind, or no key, is another job
    assert enqueue("tests.log", {}, unique_key="draft:812").was_inserted
    assert enqueue("tests.noop", {}).pk != first.pk
    assert Job.objects.count() == 3


@pytest.mark.django_db
def test_the_key_holds_while_processing_and_is_free_once_the_job_completed_failed_or_ended():
    job = enqueue("tests.noop", unique_key="k")
    claimed = job_claim_batch(worker="w", limit=1)
    assert enqueue("tests.noop", unique_key="k").pk == job.pk  # processing
    job_complete(job=claimed[0], worker="w")
    again = enqueue("tests.noop", unique_key="k")  # completed, no period asked: free
    assert again.was_inserted and again.pk != job.pk

    claimed = job_claim_batch(worker="w", limit=1)
    job_record_failure(job=claimed[0], worker="w", exc=RuntimeError("x"))  # retried: queued
    assert enqueue("tests.noop", unique_key="k").pk == again.pk
    Job.objects.filter(pk=again.pk).update(status=Job.Status.CANCELLED)
    assert enqueue("tests.noop", unique_key="k").was_inserted


@pytest.mark.django_db
def test_unique_for_keeps_the_key_after_completion_even_once_the_job_is_pruned(settings):
    job = enqueue("tests.noop", {"n": 1}, unique_key="slack:ev1", unique_for=3600)
    _finish(job.pk)
    again = enqueue("tests.noop", {"n": 2}, unique_key="slack:ev1")
    assert (again.pk, again.was_inserted) == (job.pk, False)
    assert again.status == Job.Status.COMPLETED

    from jobs.pruning import jobs_prune

    Job.objects.filter(pk=job.pk).update(completed_at=job.created_at - timedelta(days=30))
    JobUniqueKey.objects.update(expires_at=job.created_at + timedelta(days=1))  # not expired
    settings.JOBS_RETENTION_DAYS = 1
    jobs_prune()
    assert not Job.objects.filter(pk=job.pk).exists()
    after_prune = enqueue("tests.noop", {"n": 3}, unique_key="slack:ev1")
    assert (after_prune.pk, after_prune.was_inserted) == (job.pk, False)
    assert Job.objects.count() == 0

    JobUniqueKey.objects.update(expires_at=job.created_at - timedelta(seconds=1))  # expired
    assert enqueue("tests.noop", {"n": 4}, unique_key="slack:ev1").was_inserted


@pytest.mark.django_db
def test_a_failed_or_cancelled_job_starts_no_period():
    job = enqueue("tests.noop", unique_key="k", unique_for=3600, max_attempts=1)
    claimed = job_claim_batch(worker="w", limit=1)
    job_record_failure(job=claimed[0], worker="w", exc=RuntimeError("x"))
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    assert not JobUniqueKey.objects.exists()
    assert enqueue("tests.noop", unique_key="k").was_inserted


@pytest.mark.django_db(transaction=True)
def test_a_second_producer_waits_for_the_first_and_inserts_when_it_rolls_back():
    with other_session() as first:
        first_id, inserted = first.execute(LIVE_SQL, ["tests.noop", "{}", "k"]).fetchone()
        assert inserted
        thread, result = _run_in_thread(lambda: enqueue("tests.noop", {"n": 2}, unique_key="k"))
        assert _waiting_for_a_lock(), "the second producer did not wait for the first"
        assert thread.is_alive()
        first.rollback()
        thread.join(10)
    assert "error" not in result, result
    job = result["value"]
    assert job.was_inserted and job.pk != first_id
    assert list(Job.objects.values_list("pk", "payload")) == [(job.pk, {"n": 2})]


@pytest.mark.django_db(transaction=True)
def test_a_second_producer_waits_for_the_first_and_gets_its_job_when_it_commits():
    with other_session() as first:
        first_id, _ = first.execute(LIVE_SQL, ["tests.noop", '{"n": 1}', "k"]).fetchone()
        thread, result = _run_in_thread(lambda: enqueue("tests.noop", {"n": 2}, unique_key="k"))
        assert _waiting_for_a_lock()
        first.commit()
        thread.join(10)
    assert "error" not in result, result
    assert (result["value"].pk, result["value"].was_inserted) == (first_id, False)
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_completion_committed_while_the_second_producer_waits_keeps_the_key_for_its_period():
    job = enqueue("tests.noop", unique_key="k", unique_for=600)
    job_claim_batch(worker="w", limit=1)
    with other_session() as worker:
        worker.execute(
            "UPDATE jobs_job SET status = 'completed', completed_at = now(), locked_by = '', "
            "lease_expires_at = NULL WHERE id = %s",
            [job.pk],
        )
        thread, result = _run_in_thread(lambda: enqueue("tests.noop", unique_key="k"))
        assert _waiting_for_a_lock()
        worker.commit()
        thread.join(10)
    assert "error" not in result, result
    assert (result["value"].pk, result["value"].was_inserted) == (job.pk, False)
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_many_producers_at_once_leave_one_job_per_key():
    barrier = threading.Barrier(6)
    ids: list[int] = []

    def produce() -> None:
        barrier.wait(10)
        for n in range(20):
            ids.append(enqueue("tests.noop", {"n": n}, unique_key=f"k{n % 5}").pk)

    threads = [_run_in_thread(produce) for _ in range(6)]
    for thread, result in threads:
        thread.join(60)
        assert "error" not in result, result
    assert Job.objects.count() == 5
    assert set(ids) == set(Job.objects.values_list("pk", flat=True))


@pytest.mark.django_db(transaction=True)
def test_plain_sql_producers_use_the_partial_unique_index_or_the_function():
    documented = """
        INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts,
                              run_after, created_at, locked_by, last_error, unique_key)
        VALUES ('tests.noop', '{}', 'queued', 0, 0, 3, now(), now(), '', '', %s)
        ON CONFLICT (kind, unique_key)
            WHERE unique_key IS NOT NULL AND status IN ('queued', 'processing')
        DO NOTHING
        RETURNING id
    """
    with other_session() as producer:
        producer.autocommit = True
        first = producer.execute(documented, ["k"]).fetchone()
        assert first is not None
        assert producer.execute(documented, ["k"]).fetchone() is None
        assert producer.execute(LIVE_SQL, ["tests.noop", "{}", "k"]).fetchone() == (
            first[0],
            False,
        )
    assert enqueue("tests.noop", unique_key="k").pk == first[0]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_retry_now_skips_a_failed_job_whose_key_a_live_job_holds():
    failed = enqueue("tests.noop", unique_key="k", max_attempts=1)
    claimed = job_claim_batch(worker="w", limit=1)
    job_record_failure(job=claimed[0], worker="w", exc=RuntimeError("x"))
    live = enqueue("tests.noop", unique_key="k")
    other = enqueue("tests.noop", unique_key="other", max_attempts=1)
    Job.objects.filter(pk=other.pk).update(status=Job.Status.CANCELLED)

    assert jobs_retry_now(jobs=Job.objects.all()) == 2  # `live` (queued) and `other`
    assert Job.objects.get(pk=failed.pk).status == Job.Status.FAILED
    assert Job.objects.get(pk=other.pk).status == Job.Status.QUEUED
    assert Job.objects.get(pk=live.pk).status == Job.Status.QUEUED


@pytest.mark.django_db
def test_the_unique_index_is_partial_so_jobs_without_a_key_never_enter_it():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef('jobs_job_unique_key'::regclass)")
        definition = cursor.fetchone()[0]
    assert "UNIQUE" in definition
    assert "unique_key IS NOT NULL" in definition
    assert "queued" in definition and "processing" in definition


@pytest.mark.django_db(transaction=True)
def test_a_job_the_runner_completes_keeps_its_key_and_the_documented_call_works():
    from jobs import run_pending

    with other_session() as producer:
        producer.autocommit = True
        job_id, inserted = producer.execute(
            "SELECT job_id, inserted FROM jobs_enqueue_unique('tests.noop', "
            "'{\"event\": \"Ev1\"}'::jsonb, 'slack:Ev1', "
            "p_unique_for => interval '10 minutes', p_max_attempts => 5)"
        ).fetchone()
    assert inserted
    assert run_pending().completed == 1  # the runner's own statement completes it
    again = enqueue("tests.noop", unique_key="slack:Ev1")
    assert (again.pk, again.was_inserted, again.status) == (job_id, False, "completed")
    assert JobUniqueKey.objects.get().job_id == job_id
