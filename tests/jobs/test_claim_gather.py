"""Issue 36, point 2: after a small claim, the runner lets the next batch gather.

Next to a pinned snapshot every claim walks the dead index entries above its floor, a cost
per statement, not per job; two drains that claim as soon as they have run the 1-3 jobs a
steady producer brought meanwhile sent hundreds of statements a second and took the CPU
the producer's commits needed. So after a claim of less than half JOBS_CLAIM_BATCH_SIZE,
the next claim is sent no sooner than JOBS_CLAIM_GATHER_SECONDS after it; after a fuller
claim, at once. The speed is measured by bench/hot_rows.py; these tests hold the
behaviour, with a gather long enough to tell apart on a loaded machine.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from jobs import enqueue
from jobs.runner import run_pending
from tests.support.lost_answer import EveryConnection
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


class _Claims(EveryConnection):
    """Each claim statement the process sends (any thread): when it was sent, and the ids it
    claimed (the drain's rows `processing` right after it: the runner claims only once the
    batch before is done, and completes that batch in the same statement). `after_first`
    runs once, right after the first claim that took a job."""

    def __init__(self, after_first=None) -> None:
        self.claims: list[tuple[float, list[int]]] = []
        self.after_first = after_first
        super().__init__(self._record)

    def _record(self, execute, sql, params, many, context):
        if "jobs_runner_step" not in sql or not params or not params[6]:
            return execute(sql, params, many, context)
        sent = time.monotonic()
        result = execute(sql, params, many, context)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM jobs_job WHERE status = 'processing' AND locked_by = %s "
                "ORDER BY id",
                [params[0]],
            )
            ids = [row[0] for row in cursor.fetchall()]
        self.claims.append((sent, ids))
        if ids and self.after_first is not None:
            after_first, self.after_first = self.after_first, None
            after_first()
        return result

    def batches(self) -> list[list[int]]:
        return [ids for _sent, ids in self.claims if ids]


def _enqueue_later(delays: list[float], ids: list[int]) -> threading.Thread:
    """Insert a no-op job after each delay (seconds from now), from a thread of its own (as
    another producer would), its id appended to `ids`."""

    def produce() -> None:
        try:
            start = time.monotonic()
            for delay in delays:
                time.sleep(max(0.0, start + delay - time.monotonic()))
                ids.append(enqueue("tests.noop").id)
        finally:
            connection.close()

    thread = threading.Thread(target=produce)
    thread.start()
    return thread


def test_after_a_small_claim_the_next_waits_and_takes_what_arrived_meanwhile(settings):
    """The first claim takes one job; a producer then commits one job at once and one
    0.3 s later. The next claim is sent 1.5 s after the first and takes both (before: it
    went out as soon as the first job had run and took one job, the next claim the other)."""
    settings.JOBS_CLAIM_GATHER_SECONDS = 1.5
    first = enqueue("tests.noop").id
    later: list[int] = []
    producer: list[threading.Thread] = []
    stop = threading.Event()
    result: dict = {}
    with _Claims(after_first=lambda: producer.append(_enqueue_later([0, 0.3], later))) as seen:
        thread = drain_in_thread(result, linger=30, stop=stop)
        try:
            wait_until(lambda: len(later) == 2, "the producer's two jobs")
            wait_until(
                lambda: sum(len(ids) for ids in seen.batches()) >= 3, "all three jobs claimed"
            )
        finally:
            stop.set()
            thread.join(30)
            for p in producer:
                p.join(30)
    assert seen.batches() == [[first], sorted(later)]
    (first_sent, _), (second_sent, _) = [c for c in seen.claims if c[1]]
    # The runner counts from just before its claim (its floor and slow-kind reads come
    # between that and the statement this wrapper sees): at least most of the 1.5 s.
    assert second_sent - first_sent >= 1.0
    assert result["summary"].completed == 3


@pytest.mark.usefixtures("one_slot")
def test_after_a_full_claim_the_next_goes_at_once(settings):
    """A backlog is not held back: after a claim of half a batch or more the next claim is
    sent as soon as the batch has run. With a 60 s gather and a batch of 4, eight queued
    jobs are claimed four and four and the drain (limit 8) is done long before 60 s."""
    settings.JOBS_CLAIM_GATHER_SECONDS = 60
    settings.JOBS_CLAIM_BATCH_SIZE = 4
    ids = [enqueue("tests.noop").id for _ in range(8)]
    with _Claims() as seen:
        started = time.monotonic()
        summary = run_pending(limit=8)
    assert seen.batches() == [ids[:4], ids[4:]]
    assert summary.completed == 8
    assert time.monotonic() - started < 30


def test_a_completion_that_must_be_flushed_is_not_held_by_the_gather(settings, tmp_path):
    """A kind not declared idempotent has its completion committed, flushed, before the
    drain goes on (I21): the gather never holds it. With a 60 s gather, the job claimed
    alone is recorded completed within seconds, while the drain lingers on."""
    from jobs.models import Job

    settings.JOBS_CLAIM_GATHER_SECONDS = 60
    job = enqueue("tests.log", {"log": str(tmp_path / "runs.log"), "n": 1})
    stop = threading.Event()
    result: dict = {}
    with _Claims() as seen:
        thread = drain_in_thread(result, linger=60, stop=stop)
        try:
            wait_until(
                lambda: Job.objects.get(pk=job.pk).status == "completed",
                "the completion, flushed at once",
                timeout=30,
            )
        finally:
            stop.set()
            thread.join(30)
    assert seen.batches() == [[job.pk]]
