"""The executor (issue 37): runs handlers in slots, and knows nothing of the runner's SQL.

Ordinary handlers run in a pool of up to JOBS_CONCURRENCY threads, each with its own Django
connection, opened by the handler's first query (or its `atomic` block): with Django's pool
(DB_POOL, project/db_pool.py) checked out of the process's pool, the slots holding at most
DB_POOL_MAX_SIZE - 4 at once, and given back after a job when another slot waits for one.
It is closed (given back) once the thread has waited SLOT_IDLE_CLOSE_SECONDS for its next
job and when the drain ends.
`async def` handlers run as tasks on one event loop in a thread of the worker process, up
to JOBS_ASYNC_CONCURRENCY at once (the runner's ledger counts the slots; this module only
runs what it is given).

A slot talks to the database only for its handler: an `atomic` handler's transaction, and
the completion that must commit with that handler's writes (`services.job_complete`, as
before issue 37). Every other outcome goes back to the runner as an `Outcome`, and the
completer records it on the drain's connection.

The connection budget (issue 37, docs/operations.md): an `atomic` handler's transaction holds
a connection (behind PgBouncer, a server connection) from its first statement to its
commit, and a handler may wait inside it for something that needs another connection (the
canonical-id minter's lease did). So at most JOBS_ATOMIC_CONCURRENCY slots of a process are
inside such a transaction at once: a slot takes a unit (`TransactionUnits`) just before its
transaction's first statement, while it holds no server connection yet, and gives it back
after the commit or rollback. A handler that writes nothing takes none; `atomic=False`
and `async def` handlers take none (their completion is the drain's statement).

`Executor.slots` maps each running job to its `Slot`, which the keeper's supervisor
(jobs/stopping.py) asks to stop (`Slot.request_stop`): past its timeout, on a cancel, or
when the process stops (issue 37, points 6, 8 and 9). Asked, a thread handler sees
`job.stop_requested` set; an async one's task is cancelled on its event loop. A handler that
returns after it was asked is recorded as stopped, never as completed: it may have returned
early (an `atomic` one's transaction is rolled back).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
from django.db import connection, transaction
from psycopg.pq import TransactionStatus

from jobs import registry, services
from jobs.exceptions import LeaseLost
from jobs.stops import STOP_CANCEL, STOP_SHUTDOWN, STOP_TIMEOUT
from project import db_pool
from project.reconnect import discard_broken_connection

__all__ = ["STOP_CANCEL", "STOP_SHUTDOWN", "STOP_TIMEOUT", "Executor", "JobContext", "Slot"]

SLOT_IDLE_CLOSE_SECONDS = 1.0  # a slot thread with no job for this long closes its connection
UNIT_WAIT_LOG_SECONDS = 10.0  # a slot waiting this long for a transaction unit says so

logger = logging.getLogger(__name__)


@dataclass
class JobContext:
    """What a handler taking a second argument (`def h(payload, job)`) sees of its job."""

    id: int
    kind: str
    attempt: int  # this attempt, counting from 1
    max_attempts: int
    started_at: datetime  # when its slot started it (this host's clock, UTC)
    enqueued_at: datetime | None = None  # the row's created_at (the database's clock)
    # When the handler must have returned (its start + its kind's timeout, issue 37, point 6);
    # past it the runner asks it to stop.
    deadline: datetime | None = None
    # Set when the runner asks the handler to stop (a timeout, a cancel, the process
    # stopping): a long handler checks it between steps and returns early.
    stop_requested: threading.Event = field(default_factory=threading.Event)
    stop_reason: str | None = None  # "timeout", "cancel" or "shutdown", once asked


_stop_lock = threading.Lock()


@dataclass
class Slot:
    """One running job: its claim, its monotonic start and its context; once asked to stop,
    why and when (monotonic); an async one's loop and task, to cancel it."""

    job: services.ClaimedJob
    started: float
    context: JobContext
    is_async: bool = False
    timeout: float = 0.0  # seconds, its kind's
    stop_reason: str | None = None
    asked_at: float | None = None  # monotonic time of the first request to stop
    hung: bool = False  # asked, and not returned within JOBS_STOP_GRACE_SECONDS
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task | None = None

    @property
    def deadline(self) -> float:
        """Monotonic time past which the handler is asked to stop."""
        return self.started + self.timeout

    def request_stop(self, reason: str = STOP_TIMEOUT) -> bool:
        """Ask the handler to stop: it sees `context.stop_requested` set, and an async one's
        task is cancelled. True when this changed the reason (the first request, or a cancel
        after a timeout or a stop: the operator's word is the one recorded)."""
        with _stop_lock:
            changed = self.stop_reason is None or (
                reason == STOP_CANCEL and self.stop_reason != STOP_CANCEL
            )
            if not changed:
                return False
            self.stop_reason = self.context.stop_reason = reason
            if self.asked_at is None:
                self.asked_at = time.monotonic()
        self.context.stop_requested.set()
        loop = self.loop
        if self.is_async and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(_cancel_task, self)
            except RuntimeError:  # the loop closed meanwhile: nothing left to cancel
                pass
        return True


def _cancel_task(slot: Slot) -> None:
    """On the slot's event loop: cancel its task (a task not started yet sees the request
    when it starts, `_awaited`)."""
    if slot.task is not None and not slot.task.done():
        slot.task.cancel()


async def _awaited(slot: Slot, coroutine) -> None:  # noqa: ANN001 - the handler's coroutine
    slot.task = asyncio.current_task()
    if slot.context.stop_requested.is_set():  # asked before it started
        coroutine.close()
        raise asyncio.CancelledError
    await coroutine


@dataclass
class Outcome:
    """How a slot's run ended, for the completer.

    `result`: "completed" (committed with the handler's transaction), "done" (its completion
    goes with the runner's next statement), "lost" (the reaper had taken the row: LeaseLost),
    "error" (`error` raised; the completer records it)."""

    slot: Slot
    result: str
    error: BaseException | None = None

    @property
    def job(self) -> services.ClaimedJob:
        return self.slot.job


def new_slot(job: services.ClaimedJob, started: float) -> Slot:
    timeout = registry.timeout_of(job.kind)
    started_at = datetime.now(UTC)
    context = JobContext(
        id=job.id,
        kind=job.kind,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        started_at=started_at,
        deadline=started_at + timedelta(seconds=timeout),
    )
    return Slot(
        job=job,
        started=started,
        context=context,
        is_async=registry.is_async(job.kind),
        timeout=timeout,
    )


class _Stopped(Exception):  # noqa: N818 - internal: rolls an atomic handler's work back
    """Raised inside an atomic handler's transaction when it returned after being asked to
    stop: it may have returned early, so its writes are rolled back with its completion."""


class TransactionUnits:
    """The process's JOBS_ATOMIC_CONCURRENCY units: one per slot inside an `atomic`
    handler's transaction. `holding()` wraps such a transaction on the slot's connection and
    takes a unit just before its first statement (`connection.execute_wrapper`)."""

    def __init__(self, units: int) -> None:
        self.units = units
        self._free = threading.Semaphore(units)
        self._lock = threading.Lock()
        self.in_use = 0
        self.peak = 0

    def holding(self) -> _UnitHold:
        return _UnitHold(self)

    def take(self, kind: str) -> None:
        if not self._free.acquire(timeout=UNIT_WAIT_LOG_SECONDS):
            logger.warning(
                "a %s job has waited %s s for a transaction unit (JOBS_ATOMIC_CONCURRENCY=%s: "
                "that many atomic handlers of this process are inside their transaction)",
                kind,
                UNIT_WAIT_LOG_SECONDS,
                self.units,
                extra={"action": "job_waits_for_transaction_unit", "kind": kind},
            )
            self._free.acquire()
        with self._lock:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)

    def give_back(self) -> None:
        with self._lock:
            self.in_use -= 1
        self._free.release()


class _UnitHold:
    """A slot's hold on a unit for one transaction: taken at its first statement."""

    def __init__(self, units: TransactionUnits) -> None:
        self.units = units
        self.kind = ""
        self.taken = False

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001 - Django's wrapper
        if not self.taken:
            self.units.take(self.kind)
            self.taken = True
        return execute(sql, params, many, context)

    def release(self) -> None:
        if self.taken:
            self.taken = False
            self.units.give_back()


def run_sync(slot: Slot, *, worker: str, units: TransactionUnits | None = None) -> Outcome:
    """Run `slot`'s handler on this thread: in its own transaction (with its completion
    when it wrote something) unless registered `atomic=False`. An `async def` handler here
    (the one-slot drain) runs to its end on an event loop of its own."""
    job = slot.job
    try:
        fn = registry.get_handler(job.kind)
        args = _arguments(slot)
        if slot.is_async:
            with asyncio.Runner() as runner:
                slot.loop = runner.get_loop()
                runner.run(_awaited(slot, fn(*args)))
            return Outcome(slot, "done")
        if not registry.runs_in_transaction(job.kind):
            # It commits its own steps (claim -> commit -> external effect -> record).
            fn(*args)
            return Outcome(slot, "done")
        # The handler's own transaction: its writes and the completion commit together. If
        # it raises, atomic() rolls back here, before the completer records the failure.
        # With slots it holds a unit of the connection budget from its first statement on.
        hold = None if units is None else units.holding()
        try:
            with connection.execute_wrapper(hold) if hold else _nothing():
                if hold is not None:
                    hold.kind = job.kind
                with transaction.atomic():
                    fn(*args)
                    if slot.stop_reason is not None:
                        raise _Stopped(slot.stop_reason)  # rolled back; the completer records
                    if _wrote_nothing():
                        return Outcome(slot, "done")  # nothing to commit: the next statement
                    services.job_complete(
                        job=job, worker=worker, started_ago=time.monotonic() - slot.started
                    )
        finally:
            if hold is not None:
                hold.release()  # committed or rolled back: the server connection is free
        return Outcome(slot, "completed")
    except LeaseLost:
        return Outcome(slot, "lost")
    except BaseException as exc:  # noqa: BLE001 - handed to the completer, which records it
        discard_broken_connection()  # the handler's atomic() has rolled back: reconnect
        return Outcome(slot, "error", exc)


async def run_async(slot: Slot) -> Outcome:
    """Await `slot`'s `async def` handler; its completion is the runner's, as an
    `atomic=False` handler's is."""
    try:
        fn = registry.get_handler(slot.job.kind)
        if registry.takes_context(slot.job.kind):
            slot.context.enqueued_at = await asyncio.to_thread(_enqueued_at, slot.job.id, True)
            await fn(slot.job.payload, slot.context)
        else:
            await fn(slot.job.payload)
    except BaseException as exc:  # noqa: BLE001 - handed to the completer, which records it
        return Outcome(slot, "error", exc)
    return Outcome(slot, "done")


def drop_ended_connection() -> None:
    """Before a slot thread's next job: close its connection if the server has ended it
    since the last one (a restart, a failover, `pg_terminate_backend`), so the handler opens
    a fresh one. A slot keeps its connection from job to job, and the handler's first query
    on a dead one would fail its attempt: after a restart, one attempt per slot thread that
    held a connection (a job could spend all of its attempts in a row that way). Nothing is
    sent: an idle connection has nothing to read unless its server closed it (or wrote a
    notice, which costs only a reconnect), so a zero-timeout `poll` tells."""
    raw = connection.connection
    if raw is None or connection.in_atomic_block:
        return
    try:
        # poll(), not select(): a process with hundreds of async tasks has descriptors past
        # select()'s 1024.
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN | select.POLLPRI)
        ended = raw.closed or bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):  # the socket is already closed
        ended = True
    if ended:
        logger.info(
            "a slot's database connection was ended by the server; it opens a new one",
            extra={"action": "job_slot_reconnect"},
        )
        connection.close()


def _arguments(slot: Slot) -> tuple:
    if not registry.takes_context(slot.job.kind):
        return (slot.job.payload,)
    # Read before the handler's transaction opens: it must not count as a write there.
    slot.context.enqueued_at = _enqueued_at(slot.job.id)
    return (slot.job.payload, slot.context)


def _enqueued_at(job_id: int, close: bool = False) -> datetime | None:
    """The row's created_at; `close`: read from a helper thread of the event loop, which
    must not keep a connection once it has read it."""
    from jobs.models import Job

    try:
        return Job.objects.filter(pk=job_id).values_list("created_at", flat=True).first()
    finally:
        if close:
            connection.close()


def _give_back() -> None:
    """A pooled slot's connection back to the pool after its job (never fails the slot)."""
    try:
        connection.close()
    except Exception as exc:  # noqa: BLE001 - the pool discards a connection it cannot take back
        logger.warning("a slot could not give its connection back to the pool: %s", exc)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _wrote_nothing() -> bool:
    """Whether the open transaction has sent no statement yet (psycopg begins it lazily, at
    the first one): then there is nothing of the handler's to commit with the completion."""
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.IDLE


class Executor:
    """The drain's slots. `inline`: run each job on the calling thread, one at a time (one
    slot, or a drain inside a caller's transaction, whose claims no other connection sees).
    Otherwise thread slots, started as needed up to `threads`, and an event loop thread
    started at the first `async def` job. Outcomes come back through `collect`."""

    def __init__(
        self, *, worker: str, threads: int, inline: bool, atomic_units: int | None = None
    ) -> None:
        self.worker = worker
        self.inline = inline
        # The connection budget: none for the one-slot drain (one job at a time anyway).
        self.units = None if inline or atomic_units is None else TransactionUnits(atomic_units)
        self.slots: dict[int, Slot] = {}  # running, by job id (changed under `lock`)
        self.lock = threading.Lock()
        # Set by the supervisor when a handler asked to stop has not returned in its grace:
        # the drain stops claiming and its process retires (jobs/stopping.py).
        self.hung = threading.Event()
        self._max_threads = threads
        self._threads: list[threading.Thread] = []
        self._sync_running = 0
        self._jobs: queue.SimpleQueue[Slot | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beat_posted: float | None = None  # a beat posted to the loop, not run yet
        self._loop_thread: threading.Thread | None = None
        # Django's pool (project/db_pool.py): what the slot threads may hold of it at once.
        self._pool_share = None if inline else db_pool.SlotShare.for_settings()

    def start(self, job: services.ClaimedJob, started: float) -> Slot:
        """Start `job` (claimed, its slot counted by the caller) at monotonic `started`."""
        slot = new_slot(job, started)
        with self.lock:
            self.slots[job.id] = slot
        if self.inline:
            self._outcomes.put(run_sync(slot, worker=self.worker))
        elif slot.is_async:
            loop = slot.loop = self._event_loop()
            asyncio.run_coroutine_threadsafe(self._run_task(slot), loop)
        else:
            self._sync_running += 1
            if self._sync_running > len(self._threads) < self._max_threads:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"jobs-slot-{len(self._threads) + 1}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
            self._jobs.put(slot)
        return slot

    def collect(self, timeout: float | None = 0.0) -> list[Outcome]:
        """The outcomes of the slots that ended, waiting up to `timeout` seconds for the
        first (0: none; None: until one comes)."""
        outcomes: list[Outcome] = []
        try:
            if timeout is None or timeout > 0:
                outcomes.append(self._outcomes.get(timeout=timeout))
            while True:
                outcomes.append(self._outcomes.get_nowait())
        except queue.Empty:
            pass
        for outcome in outcomes:
            with self.lock:
                self.slots.pop(outcome.job.id, None)
            if not outcome.slot.is_async and not self.inline:
                self._sync_running -= 1
        return outcomes

    def loop_stalled_for(self) -> float:
        """Seconds the event loop has not run the beat last posted to it (0 while it keeps
        up, or without a loop): an async handler's synchronous code blocks it, and with it
        every other task on it, a cancel included. Posts the next beat when the last ran."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return 0.0
        now = time.monotonic()
        posted = self._beat_posted
        if posted is None:
            self._beat_posted = now
            loop.call_soon_threadsafe(self._beat)
            return 0.0
        return now - posted

    def _beat(self) -> None:
        self._beat_posted = None

    def running(self) -> list[Slot]:
        """The slots running now (a copy: the keeper's supervisor reads it)."""
        with self.lock:
            return list(self.slots.values())

    def shutdown(self) -> None:
        """End the slot threads (each closes its connection) and the event loop. Called once
        nothing runs but the hung handlers, if any: those are left to their daemon threads
        (their process retires, jobs/retire.py), not waited for."""
        wait = 0.5 if self.hung.is_set() else 10
        for _thread in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout=wait)
        loop = self._loop
        if loop is not None and self._loop_thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._loop_thread.join(timeout=wait)
            if not self._loop_thread.is_alive():
                loop.close()

    def _serve(self) -> None:
        """A slot thread: run what it is given; give its connection back when idle (pooled:
        also after a job while another slot waits for one of the slots' share)."""
        share = self._pool_share
        if share is not None:
            share.bind(connection)
        try:
            while True:
                try:
                    slot = self._jobs.get(timeout=SLOT_IDLE_CLOSE_SECONDS)
                except queue.Empty:
                    connection.close()
                    continue
                if slot is None:
                    return
                drop_ended_connection()
                outcome = run_sync(slot, worker=self.worker, units=self.units)
                if share is not None and share.wanted():
                    _give_back()  # to a slot waiting for one, before the completer hears
                self._outcomes.put(outcome)
        finally:
            connection.close()

    async def _run_task(self, slot: Slot) -> None:
        slot.task = asyncio.current_task()
        if slot.context.stop_requested.is_set():  # asked before it started: never started
            self._outcomes.put(Outcome(slot, "error", asyncio.CancelledError()))
            return
        self._outcomes.put(await run_async(slot))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:
                    connection.close()

            self._loop_thread = threading.Thread(target=run, name="jobs-event-loop", daemon=True)
            self._loop_thread.start()
            ready.wait(10)
            self._loop = loop
        return self._loop
