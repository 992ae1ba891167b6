"""Bulk enqueue (issue 38, point 7): `jobs.enqueue_many(kind, payloads, **options)` inserts
every job in one statement, returns how many it inserted, and keeps the unique keys, the
wake-up and the lanes as one `enqueue` does."""

from __future__ import annotations

import math
import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import jobs
from jobs import enqueue
from jobs.exceptions import EnqueueError
from jobs.models import Job, JobLane
from jobs.outcomes import job_complete
from jobs.runner_step import job_claim_batch
from tests.support.sessions import other_session
from tests.support.wakeup import listening


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_inserts_in_one_statement_and_wakes_once():
    with listening() as wakeups:
        with CaptureQueriesContext(connection) as queries:
            count = jobs.enqueue_many(
                "tests.noop",
                [{"n": n} for n in range(500)],
                priority=4,
                tags=["backfill"],
                meta={"proposal": 812},
                max_attempts=2,
            )
        assert count == 500
        assert len([q for q in queries if "INSERT" in q["sql"]]) == 1
        assert wakeups() == ["jobs_job_due"]
    rows = Job.objects.all()
    assert rows.count() == 500
    assert set(rows.values_list("priority", "max_attempts", "status")) == {(4, 2, "queued")}
    assert sorted(rows.values_list("payload__n", flat=True)) == list(range(500))
    assert all(tags == ["backfill"] for tags in rows.values_list("tags", flat=True))
    assert all(meta == {"proposal": 812} for meta in rows.values_list("meta", flat=True))
    assert JobLane.objects.filter(kind="tests.noop", priority=4).exists()
    assert jobs.run_pending().completed == 500


@pytest.mark.django_db
def test_enqueue_many_keeps_the_unique_keys():
    live = enqueue("tests.noop", {"n": -1}, unique_key="k1")
    done = enqueue("tests.noop", unique_key="k2", unique_for=600)
    claimed = job_claim_batch(worker="w", limit=10)
    for job in claimed:
        if job.id == done.pk:
            job_complete(job=job, worker="w")
    count = jobs.enqueue_many(
        "tests.noop",
        [{"n": n} for n in range(6)],
        unique_keys=["k1", "k2", "k3", "k3", None, None],
    )
    assert count == 3  # k1 live, k2 in its period, the second k3 a duplicate of the first
    keys = sorted(Job.objects.exclude(pk__in=[live.pk, done.pk]).values_list("payload__n"))
    assert keys == [(2,), (4,), (5,)]


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_waits_for_an_uncommitted_key_and_inserts_when_it_rolls_back():
    result: dict = {}
    with other_session() as first:
        first.execute("SELECT * FROM jobs_enqueue_unique('tests.noop', '{}'::jsonb, 'k')")

        def bulk() -> None:
            try:
                result["count"] = jobs.enqueue_many("tests.noop", [{}, {}], unique_keys=["k", "j"])
            finally:
                connection.close()

        thread = threading.Thread(target=bulk, daemon=True)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive()  # waiting for the first producer's transaction
        first.rollback()
        thread.join(10)
    assert result["count"] == 2
    assert Job.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payloads", "options"),
    [
        ([{"n": 1}, ["a list"]], {}),
        ([{"n": 1}, None], {}),
        ([{"n": 1}, {"x": object()}], {}),
        ([{"n": 1}, {"x": math.nan}], {}),
        ([{"n": 1}, {"x": "a\x00b"}], {}),
        ("not a list", {}),
        ([{"n": 1}], {"unique_keys": ["k", "too many"]}),
        ([{"n": 1}], {"unique_keys": ["k" * (10 * 1024 * 1024)]}),
        ([{"n": 1}], {"tags": [1]}),
        ([{"n": 1}], {"meta": []}),
        ([{"n": 1}], {"unique_key": "one key for all"}),
        ([{"n": 1}], {"max_attempts": 0}),
    ],
)
def test_hostile_bulk_input_is_a_clear_error_and_nothing_is_written(payloads, options):
    with transaction.atomic():
        with pytest.raises(EnqueueError):
            jobs.enqueue_many("tests.noop", payloads, **options)
        assert Job.objects.count() == 0  # the caller's transaction is still usable


@pytest.mark.django_db
def test_enqueue_many_of_nothing_inserts_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert jobs.enqueue_many("tests.noop", []) == 0
    assert len(queries) == 0
