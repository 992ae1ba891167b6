"""One job's run in a slot: what a handler sees of its job (`JobContext`), the running job
(`Slot`, which the supervisor asks to stop), how its run ended (`Outcome`), and the runs
themselves: `run_sync` (a thread slot, or the one-slot drain's thread) and `run_async` (a
task on the executor's event loop). Apart from the executor (jobs/slots.py), which decides
where and when a job runs, because this is what happens inside one run, the same on every
kind of slot.

A slot talks to the database only for its handler: an `atomic` handler's transaction, and
the completion that must commit with that handler's writes (`outcomes.job_complete`, as
before issue 37). Every other outcome goes back to the runner as an `Outcome`, and the
completer records it on the drain's connection. An `atomic` handler's transaction holds a
unit of the connection budget (jobs/transaction_units.py) from its first statement on.

Asked to stop (`Slot.request_stop`: past its timeout, on a cancel, or when the process
stops; issue 37, points 6, 8 and 9), a thread handler sees `job.stop_requested` set; an
async one's task is cancelled on its event loop. A handler that returns after it was asked
is recorded as stopped, never as completed: it may have returned early (an `atomic` one's
transaction is rolled back).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from psycopg.pq import TransactionStatus

from jobs import registry
from jobs.exceptions import LeaseLost
from jobs.outcomes import job_complete
from jobs.runner_step import ClaimedJob
from jobs.stops import STOP_CANCEL, STOP_TIMEOUT
from jobs.transaction_units import TransactionUnits
from project.reconnect import discard_broken_connection, server_ended

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

    job: ClaimedJob
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
    def job(self) -> ClaimedJob:
        return self.slot.job


def new_slot(job: ClaimedJob, started: float) -> Slot:
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
                    job_complete(
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
    sent (`project.reconnect.server_ended`)."""
    raw = connection.connection
    if raw is None or connection.in_atomic_block:
        return
    ended = server_ended(raw)
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


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _wrote_nothing() -> bool:
    """Whether the open transaction has sent no statement yet (psycopg begins it lazily, at
    the first one): then there is nothing of the handler's to commit with the completion."""
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.IDLE
