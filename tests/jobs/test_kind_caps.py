"""A cap per kind for the whole deployment (issue 37, point 2): at most N jobs of a capped
kind are `processing` at once, whoever claims them; a claim takes at most the smaller of the
free units and what it asked for; a job held back by its cap stays queued with its attempts
unchanged, and jobs of other kinds pass it. Two claimers racing for the last unit do not
both get it: the race is forced (one claim holds its unit uncommitted while the other asks),
not hoped for.

The caps are written straight into `jobs_kindcap` here (the start-up sync has its own tests,
tests/jobs/test_kind_cap_sync.py); the claims are the runner's statement and the tools'
`job_claim_batch`, on connections of their own where they race.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs.models import Job, KindCap
from jobs.runner_step import job_claim_batch, job_runner_step
from jobs.selectors import job_due_or_task_waiting

pytestmark = pytest.mark.django_db(transaction=True)

CAPPED = "tests.capped_one"  # any kind: the cap is the row below, not the handler's


def _queue(kind: str, count: int, *, priority: int = 0, ago: str = "1 minute") -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, jsonb_build_object('n', g), 'queued', %s, 0, 3, "
            "now() - %s::interval + g * interval '1 ms', now(), '', '' "
            "FROM generate_series(1, %s) AS g RETURNING id",
            [kind, priority, ago, count],
        )
        return sorted(row[0] for row in cursor.fetchall())


def _cap(kind: str, concurrency: int) -> None:
    KindCap.objects.update_or_create(kind=kind, defaults={"concurrency": concurrency})


def _processing(kind: str) -> int:
    return Job.objects.filter(kind=kind, status=Job.Status.PROCESSING).count()


def test_a_claim_takes_at_most_the_free_units_of_a_capped_kind():
    _cap(CAPPED, 3)
    _queue(CAPPED, 10)
    assert len(job_runner_step(worker="a", claim=2).claimed) == 2
    assert len(job_runner_step(worker="b", claim=5).claimed) == 1  # the last free unit
    assert job_runner_step(worker="c", claim=5).claimed == []  # at its cap
    assert _processing(CAPPED) == 3
    # held back: still queued, no attempt spent
    assert set(Job.objects.filter(status="queued").values_list("attempts", flat=True)) == {0}
    assert Job.objects.filter(status="queued").count() == 7


def test_jobs_of_other_kinds_pass_a_capped_kind_at_its_cap():
    _cap(CAPPED, 1)
    _queue(CAPPED, 5, priority=9, ago="1 hour")  # older and more urgent, but capped
    other = _queue("tests.noop", 3)
    first = job_runner_step(worker="a", claim=1).claimed
    assert [job.kind for job in first] == [CAPPED]
    passed = job_runner_step(worker="b", claim=10).claimed
    assert sorted(job.id for job in passed) == other
    assert _processing(CAPPED) == 1
    waiting = Job.objects.filter(kind=CAPPED, status="queued")
    assert waiting.count() == 4 and set(waiting.values_list("attempts", flat=True)) == {0}


def test_the_cap_counts_every_lane_of_the_kind():
    """A kind queued at two priorities has two lanes; the cap is the kind's."""
    _cap(CAPPED, 2)
    high = _queue(CAPPED, 3, priority=5)
    _queue(CAPPED, 3, priority=0)
    claimed = job_runner_step(worker="a", claim=10).claimed
    assert sorted(job.id for job in claimed) == high[:2]  # in claim order, 2 at most
    assert _processing(CAPPED) == 2


def test_a_unit_freed_by_a_completion_is_taken_by_the_same_statements_claim():
    _cap(CAPPED, 1)
    first, second = _queue(CAPPED, 2)
    (job,) = job_runner_step(worker="a", claim=5).claimed
    assert job.id == first
    step = job_runner_step(worker="a", done=[(first, 0.01)], claim=5)
    assert step.completed == {first}
    assert [job.id for job in step.claimed] == [second]


def test_the_tools_claim_honours_the_cap_too():
    _cap(CAPPED, 2)
    _queue(CAPPED, 5)
    assert len(job_claim_batch(worker="a", limit=10)) == 2
    assert job_claim_batch(worker="b", limit=10) == []
    assert _processing(CAPPED) == 2


def test_a_kind_at_its_cap_is_not_due_for_the_drains_linger_poll():
    """A lingering drain must not claim in a loop what its claim cannot take."""
    _cap(CAPPED, 1)
    _queue(CAPPED, 3)
    job_runner_step(worker="a", claim=1)
    assert job_due_or_task_waiting(now=timezone.now()).due_run_after is None
    _cap(CAPPED, 2)  # a unit free again: due
    assert job_due_or_task_waiting(now=timezone.now()).due_run_after is not None


def _claim_in_thread(worker: str, results: dict) -> threading.Thread:
    def claim() -> None:
        try:
            results[worker] = job_runner_step(worker=worker, claim=5).claimed
        finally:
            connections.close_all()  # this thread's own connection

    thread = threading.Thread(target=claim, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_two_claimers_racing_for_the_last_unit_do_not_both_get_it(first_commits):
    """Claimer a has taken the last unit and not yet committed when claimer b asks: b must
    wait for a's outcome, then see it. Without the per-kind lock, b counted one unit in use
    (a's claim is invisible to it until a commits) and took a second job."""
    _cap(CAPPED, 2)
    _queue(CAPPED, 5)
    assert len(job_runner_step(worker="z", claim=1).claimed) == 1  # one unit left
    results: dict = {}
    try:
        with transaction.atomic():
            assert len(job_runner_step(worker="a", claim=5).claimed) == 1  # the last unit
            racer = _claim_in_thread("b", results)
            racer.join(timeout=1.0)
            assert racer.is_alive(), f"b did not wait for a's claim: it took {results.get('b')}"
            if not first_commits:
                transaction.set_rollback(True)
    finally:
        racer.join(timeout=10)
    assert not racer.is_alive()
    assert len(results["b"]) == (0 if first_commits else 1)
    assert _processing(CAPPED) == 2


def test_a_capped_kind_never_exceeds_its_cap_with_several_claimers():
    """Four claimers, each on its own connection, claim batches, hold them a few ms and
    complete them, for 3 s; each records when it held which job (after its claim returned,
    before it sent the completion: inside the row's `processing` time). A sampler counts the
    processing rows in the database meanwhile. Neither ever sees more than the cap."""
    cap, claimers, seconds = 3, 4, 3.0
    _cap(CAPPED, cap)
    _queue(CAPPED, 3000)
    _queue("tests.noop", 3000)
    held: list[tuple[float, float, str]] = []
    sampled: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def claimer(worker: str) -> None:
        rng = random.Random(worker)
        done: list[tuple[int, float]] = []
        try:
            while time.monotonic() < stop:
                step = job_runner_step(worker=worker, done=done, claim=rng.choice([1, 2, 5]))
                got = time.monotonic()
                time.sleep(rng.uniform(0.001, 0.01))
                with lock:
                    held.extend((got, time.monotonic(), job.kind) for job in step.claimed)
                done = [(job.id, 0.0) for job in step.claimed]
            job_runner_step(worker=worker, done=done)
        finally:
            connections.close_all()

    def sampler() -> None:
        try:
            while time.monotonic() < stop:
                sampled.append(_processing(CAPPED))
                time.sleep(0.002)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{n}",)) for n in range(claimers)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    capped = sorted((start, end) for start, end, kind in held if kind == CAPPED)
    events = sorted([(start, 1) for start, _end in capped] + [(end, -1) for _start, end in capped])
    running = peak = 0
    for _at, change in events:
        running += change
        peak = max(peak, running)
    kinds = Counter(kind for _s, _e, kind in held)
    print(f"held at once: {peak}; sampled max {max(sampled)}; jobs per kind {dict(kinds)}")
    assert kinds[CAPPED] > 50 and kinds["tests.noop"] > 50, kinds
    assert peak <= cap and max(sampled) <= cap, (peak, max(sampled))
    assert peak == cap, "the cap's units should all have been used"
    # Nothing held back spent an attempt: every row's attempts is its claims.
    queued = Job.objects.filter(kind=CAPPED, status="queued")
    assert set(queued.values_list("attempts", flat=True)) == {0}
