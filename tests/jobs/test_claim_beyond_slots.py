"""Issue 37, point 4 (the idempotent no-op's CPU per job): a drain with slots claims past its
free thread slots for the kinds nothing limits, so a step carries a batch (its server cost is
about fixed per step), and holds the part it has not started as the one-slot drain does. A
capped kind still takes at most the smaller of its free units and the free slots (point 2:
no process hoards units it cannot start), a kind known to run long nothing past the free
slots, and a process with reserved slots claims as before (tests/jobs/test_slot_budget.py).
What waits unstarted is given back when no slot frees for JOBS_HOLD_UNSTARTED_SECONDS.

The statement is `jobs_runner_step_v7` (migration 0028); the drain asks for a batch whenever
a slot is free (jobs/drain.py)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobs import run_pending
from jobs.ledger import Room
from jobs.models import Job, KindCap
from jobs.runner_step import job_runner_step
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

FREE, CAPPED, SLOW = "tests.beyond_free", "tests.beyond_capped", "tests.beyond_slow"
NOOP = "tests.noop"  # idempotent, no cap of its own (tests/jobs/handlers.py)


def _queue(kind: str, count: int, *, priority: int = 0) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, jsonb_build_object('n', g), 'queued', %s, 0, 3, "
            "now() - interval '1 minute' + g * interval '1 ms', now(), '', '' "
            "FROM generate_series(1, %s) AS g RETURNING id",
            [kind, priority, count],
        )
        return sorted(row[0] for row in cursor.fetchall())


def _processing(kind: str) -> int:
    return Job.objects.filter(kind=kind, status=Job.Status.PROCESSING).count()


def _room(thread_free: int) -> Room:
    return Room(reserved={}, async_kinds=[], thread_free=thread_free, async_free=500)


def test_a_claim_with_slots_takes_past_the_free_slots_only_for_a_kind_nothing_limits():
    """Two thread slots free, a claim of 20 allowed 18 past them: the capped kind (first in
    claim order, 5 units free) takes 2, as many as the free slots can start; the uncapped
    kind after it takes all of its 10, 8 of them to wait for a slot. Nothing past the free
    slots without `beyond` (v6's claim)."""
    KindCap.objects.create(kind=CAPPED, concurrency=5)
    _queue(CAPPED, 10, priority=10)
    _queue(FREE, 10)

    step = job_runner_step(worker="w", claim=20, room=_room(2), beyond=18)

    assert [job.kind for job in step.claimed] == [CAPPED] * 2 + [FREE] * 10
    assert (_processing(CAPPED), _processing(FREE)) == (2, 10)

    Job.objects.update(status=Job.Status.QUEUED, attempts=0, locked_by="")
    step = job_runner_step(worker="w", claim=20, room=_room(2))
    assert [job.kind for job in step.claimed] == [CAPPED] * 2


def test_a_kind_known_to_run_long_is_not_claimed_past_the_free_slots_nor_what_follows_it():
    """A slow kind takes the free slots and no more; an uncapped kind behind it in claim order
    would wait for those slots, so none of it is taken either. Without a slow row ahead, the
    free slots' rows of any kind are taken as before."""
    _queue(SLOW, 5, priority=10)
    _queue(FREE, 5)

    step = job_runner_step(worker="w", claim=20, room=_room(2), beyond=18, slow_kinds=[SLOW])

    assert [job.kind for job in step.claimed] == [SLOW, SLOW]
    assert _processing(FREE) == 0


def _claims_taken(kind: str) -> list[int]:
    """Run a drain; return the jobs of `kind` `processing` right after each of its claims."""
    after: list[int] = []

    def record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "jobs_runner_step" in sql and params and params[6]:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM jobs_job WHERE status = 'processing' AND kind = %s",
                    [kind],
                )
                after.append(cursor.fetchone()[0])
        return result

    with connection.execute_wrapper(record):
        summary = run_pending()
    assert summary.completed == 10, summary
    return after


def test_a_drain_with_two_slots_claims_a_batch_of_an_uncapped_kind_in_one_step(settings):
    """JOBS_CONCURRENCY=2, 10 idempotent no-ops: one step claims all 10 (each step was at most
    the two free slots: five claims or more)."""
    settings.JOBS_CONCURRENCY = 2
    _queue(NOOP, 10)

    after = _claims_taken(NOOP)

    assert after[0] == 10, after


def test_a_drain_with_two_slots_never_claims_a_capped_kind_past_its_free_slots(settings):
    """The same drain, the kind capped at 5: no claim leaves more than the two slots' jobs
    `processing` (it would hold units it cannot start)."""
    settings.JOBS_CONCURRENCY = 2
    KindCap.objects.create(kind=NOOP, concurrency=5)
    _queue(NOOP, 10)

    after = _claims_taken(NOOP)

    assert max(after) <= 2, after


GATE, QUICK = "tests.beyond_gate", "tests.beyond_quick"


def test_jobs_claimed_past_the_slots_are_given_back_when_no_slot_frees(settings, register):
    """Two slots held by jobs that block; the quick jobs claimed with them wait unstarted,
    and the keeper gives them back (queued, no attempt spent) once no job has started for
    JOBS_HOLD_UNSTARTED_SECONDS, while the two still run: another worker may take them.
    Let go, the drain runs them all."""
    settings.JOBS_CONCURRENCY = 2
    settings.JOBS_HOLD_UNSTARTED_SECONDS = 1.0
    gate, ran = threading.Event(), []

    @register(GATE, atomic=False)
    def blocks(payload: dict) -> None:
        gate.wait(30)

    @register(QUICK, atomic=False, idempotent=True)
    def quick(payload: dict) -> None:
        ran.append(payload["n"])

    _queue(GATE, 2, priority=10)
    _queue(QUICK, 10)
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        wait_until(lambda: _processing(QUICK) == 10, "the quick jobs claimed", timeout=20)
        wait_until(
            lambda: (
                Job.objects.filter(kind=QUICK, status=Job.Status.QUEUED, attempts=0).count() == 10
            ),
            "the quick jobs given back",
            timeout=10,
        )
        assert _processing(GATE) == 2 and ran == []
    finally:
        gate.set()
        thread.join(60)
    assert result["summary"].completed == 12, result["summary"]
    assert sorted(ran) == list(range(1, 11))
