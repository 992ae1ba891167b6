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

What one run does (the handler, its transaction, its completion, its `Outcome`) is
jobs/handler_run.py's; the connection budget of the thread slots, at most
JOBS_ATOMIC_CONCURRENCY inside an `atomic` handler's transaction, is
jobs/transaction_units.py's.

`Executor.slots` maps each running job to its `Slot`, which the keeper's supervisor
(jobs/stopping.py) asks to stop (`Slot.request_stop`): past its timeout, on a cancel, or
when the process stops (issue 37, points 6, 8 and 9).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from django.db import connection

from jobs.handler_run import Outcome, Slot, drop_ended_connection, new_slot, run_async, run_sync
from jobs.runner_step import ClaimedJob
from jobs.transaction_units import TransactionUnits
from project import db_pool

__all__ = ["Executor"]

SLOT_IDLE_CLOSE_SECONDS = 1.0  # a slot thread with no job for this long closes its connection

logger = logging.getLogger(__name__)


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

    def start(self, job: ClaimedJob, started: float) -> Slot:
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


def _give_back() -> None:
    """A pooled slot's connection back to the pool after its job (never fails the slot)."""
    try:
        connection.close()
    except Exception as exc:  # noqa: BLE001 - the pool discards a connection it cannot take back
        logger.warning("a slot could not give its connection back to the pool: %s", exc)
