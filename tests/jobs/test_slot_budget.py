"""Issue 37, points 1 and 3: slots a kind keeps for itself (`@handler(kind, reserved=N)`),
enforced by the claim, and the connection budget (JOBS_ATOMIC_CONCURRENCY): a process's
atomic handlers cannot hold every pooled server connection while what they wait for needs
one more.

The handlers are registered by a fixture and removed after the test: a reservation left in
this process's registry would shrink every later test's shared slots."""

from __future__ import annotations

import threading
import time
from io import StringIO

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection

from jobs import enqueue, enqueue_many, run_pending
from jobs.models import Job
from tests.support.pgbouncer import django_through_pgbouncer
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

BACKFILL, REPLY = "tests.budget_backfill", "tests.budget_reply"


def _processing(kind: str) -> int:
    return Job.objects.filter(kind=kind, status=Job.Status.PROCESSING).count()


@pytest.mark.serial
def test_a_backfill_filling_every_slot_does_not_keep_a_reserved_kind_waiting(settings, register):
    """Point 3: 200 backfill jobs whose handler blocks until the test lets it go; a reply
    kind keeps one of the process's four slots. The claim never takes a fourth backfill job
    (the database shows three processing, however long it runs), and a reply enqueued while
    the backfill holds every other slot starts within a second."""
    settings.JOBS_CONCURRENCY = 4
    gate, reply_started = threading.Event(), threading.Event()
    started: list[int] = []

    @register(BACKFILL, atomic=False)
    def backfill(payload: dict) -> None:
        started.append(payload["n"])
        gate.wait(60)

    @register(REPLY, atomic=False, reserved=1)
    def reply(payload: dict) -> None:
        reply_started.set()

    enqueue_many(BACKFILL, [{"n": n} for n in range(200)])
    stop, result = threading.Event(), {}
    thread = drain_in_thread(result, stop=stop)
    try:
        wait_until(lambda: len(started) == 3, "the backfill in every shared slot", timeout=20)
        for _ in range(5):  # several claims later: still three, the reply's slot kept free
            time.sleep(0.2)
            assert _processing(BACKFILL) == 3
        assert len(started) == 3

        enqueued = time.monotonic()
        enqueue(REPLY, {"to": "C123"})
        assert reply_started.wait(10), "the reply never started while the backfill ran"
        waited = time.monotonic() - enqueued
        assert not gate.is_set() and len(started) == 3  # it passed the whole backfill
        assert waited < 1.0, f"the reply started {waited:.2f} s after it was enqueued"
    finally:
        stop.set()
        gate.set()
        thread.join(60)
    assert Job.objects.get(kind=REPLY).status == Job.Status.COMPLETED


def test_reservations_that_leave_no_shared_slot_are_refused_naming_the_kind(settings, register):
    settings.JOBS_CONCURRENCY = 2

    @register(REPLY, atomic=False, reserved=2)
    def reply(payload: dict) -> None:
        pass

    with pytest.raises(ImproperlyConfigured, match=r"tests\.budget_reply 2.*JOBS_CONCURRENCY=2"):
        run_pending()


def test_run_jobs_refuses_to_start_with_reservations_that_do_not_fit(settings, register):
    """The start-up check: the command stops before it claims anything, naming the kind."""
    settings.JOBS_CONCURRENCY = 3

    @register(REPLY, atomic=False, reserved=3)
    def reply(payload: dict) -> None:
        pass

    job = enqueue(REPLY, {})
    with pytest.raises(ImproperlyConfigured, match=r"reserve 3 thread slots.*tests\.budget_reply"):
        call_command("run_jobs", "--burst", stdout=StringIO())
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and job.attempts == 0


def test_a_reservation_must_be_a_whole_number(register):
    with pytest.raises(ImproperlyConfigured, match=r"reserved=-1 must be a whole number >= 0"):
        register(REPLY, reserved=-1)


@pytest.mark.serial
def test_at_most_the_budgets_atomic_handlers_are_inside_their_transaction_at_once(
    settings, register
):
    """JOBS_ATOMIC_CONCURRENCY=1 with four slots: four atomic handlers start at once, one
    at a time is inside its transaction (from its first statement to its commit); the
    others wait before their first statement, holding no server connection."""
    settings.JOBS_CONCURRENCY = 4
    settings.JOBS_ATOMIC_CONCURRENCY = 1
    lock, gate = threading.Lock(), threading.Event()
    seen = {"started": 0, "inside": 0, "peak": 0}

    @register(BACKFILL)
    def write(payload: dict) -> None:
        with lock:
            seen["started"] += 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # the transaction's first statement
        with lock:
            seen["inside"] += 1
            seen["peak"] = max(seen["peak"], seen["inside"])
        gate.wait(30)
        with lock:
            seen["inside"] -= 1

    enqueue_many(BACKFILL, [{"n": n} for n in range(4)])
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        wait_until(lambda: seen["started"] == 4, "four atomic handlers started", timeout=20)
        time.sleep(0.5)  # without the budget the other three would be inside by now
        assert seen["peak"] == 1
    finally:
        gate.set()
        thread.join(60)
    assert result["summary"].completed == 4
    assert seen["peak"] == 1


@pytest.mark.serial
def test_atomic_handlers_waiting_on_another_connection_cannot_stall_behind_a_pool(
    settings, register
):
    """Behind PgBouncer with two server connections, four slots run atomic handlers that,
    inside their transaction, need one more connection (as the minter's lease renewal did):
    without the budget two transactions held both servers, the other two waited for one and
    the extra connections waited forever. With JOBS_ATOMIC_CONCURRENCY=1 every job completes
    on its first attempt."""
    settings.JOBS_CONCURRENCY = 4
    settings.JOBS_ATOMIC_CONCURRENCY = 1
    with django_through_pgbouncer(pool_size=2) as pooled:

        @register(BACKFILL)
        def hold_and_wait(payload: dict) -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # this transaction holds a server connection
            answered: list[int] = []

            def other() -> None:
                with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
                    answered.append(conn.execute("SELECT 1").fetchone()[0])

            helper = threading.Thread(target=other, daemon=True)
            helper.start()
            helper.join(10)
            if not answered:
                raise RuntimeError("waited 10 s for a second connection: stalled behind the pool")

        enqueue_many(BACKFILL, [{"n": n} for n in range(8)], max_attempts=1)
        summary = run_pending()

    assert (summary.completed, summary.failed) == (8, 0)


def test_the_claim_takes_no_more_of_a_kind_than_the_slots_can_start():
    """The statement itself (jobs_runner_step_v6): with two shared thread slots free and one
    slot of the reply kind's own, a claim of 20 takes the first two backfill jobs and the
    reply; the other backfill jobs stay queued, no attempt spent."""
    from jobs.ledger import Room
    from jobs.runner_step import job_runner_step

    backfill = [j.pk for j in (enqueue(BACKFILL, {"n": n}) for n in range(10))]
    reply = enqueue(REPLY, {}).pk

    room = Room(reserved={REPLY: 1}, async_kinds=[], thread_free=2, async_free=500)
    claimed = [job.id for job in job_runner_step(worker="w", claim=20, room=room).claimed]

    assert sorted(claimed) == sorted([*backfill[:2], reply])
    assert Job.objects.filter(status=Job.Status.QUEUED, attempts=0).count() == 8


def test_a_kind_whose_slots_are_full_is_passed_by_the_next_kind_in_claim_order():
    """No shared slot free: the backfill's jobs (first in claim order) are not taken, the
    reply (its own slot free) is; with no own slot free either, nothing is."""
    from jobs.ledger import Room
    from jobs.runner_step import job_runner_step

    for n in range(5):
        enqueue(BACKFILL, {"n": n})
    reply = enqueue(REPLY, {}).pk
    full = Room(reserved={REPLY: 0}, async_kinds=[], thread_free=0, async_free=500)
    assert job_runner_step(worker="w", claim=20, room=full).claimed == []

    room = Room(reserved={REPLY: 1}, async_kinds=[], thread_free=0, async_free=500)
    assert [job.id for job in job_runner_step(worker="w", claim=20, room=room).claimed] == [reply]
