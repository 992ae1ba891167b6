"""The supervisor of running handlers (issue 37, points 6 and 8), ticked by the drain's keeper
thread (jobs/keeper.py) between its heartbeats, so it works whatever the drain's own thread
is doing (in the one-slot drain that thread runs the handler itself).

Each tick it asks the handlers past their timeout to stop (`Slot.request_stop`: a thread
handler sees `job.stop_requested` set, an async one's task is cancelled); every
CANCEL_POLL_SECONDS while any runs, it asks the database which of its running jobs an
operator cancelled (one primary-key lookup per running job, on the keeper's connection:
the same path for a qcluster worker and `run_jobs`, which has no listener) and asks those
to stop; and it marks `hung` every handler that has not returned JOBS_STOP_GRACE_SECONDS
after it was asked. A hung handler cannot be killed (a thread) or will not stop (an async
one that swallows its cancellation, or blocks the event loop): the drain then stops
claiming, lets its other slots finish and its process retires (jobs/drain.py,
jobs/retire.py). Nothing here writes a job's outcome: the completer does, once the handler
has returned, and the reaper after the retired process is gone (I21).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from jobs.completer import RunSummary
from jobs.conf import Config
from jobs.handler_run import Outcome, Slot
from jobs.keeper import ago
from jobs.ledger import Ledger
from jobs.retire import EXIT_RETIRED
from jobs.runner_step import job_runner_step
from jobs.slots import Executor
from jobs.stops import (
    STOP_CANCEL,
    STOP_LOOP_BLOCKED,
    STOP_SHUTDOWN,
    STOP_TIMEOUT,
    job_give_up,
    jobs_cancel_requested,
)

logger = logging.getLogger(__name__)

# How often a drain with running handlers asks for cancel requests: a cancel reaches its
# handler within this (plus the keeper's tick), well inside the second issue 37 asks for.
CANCEL_POLL_SECONDS = 0.5


class Supervisor:
    """`stop`: the drain's stop event (SIGTERM): JOBS_SHUTDOWN_GRACE_SECONDS after it is set,
    the handlers still running are asked to stop. `on_hung`: what the keeper does once a
    handler is hung (the one-slot drain, whose own thread is stuck in it: `retire_inline`);
    with slots the drain's thread sees `executor.hung` itself."""

    def __init__(
        self,
        executor: Executor,
        *,
        worker: str,
        config: Config,
        stop: threading.Event | None = None,
    ) -> None:
        self.executor = executor
        self.worker = worker
        self.grace = config.stop_grace_seconds
        self.shutdown_grace = config.shutdown_grace_seconds
        self.stop = stop
        self.on_hung: Callable[[], object] | None = None
        self._next_poll = 0.0
        self._stop_seen: float | None = None

    def tick(self) -> None:
        """Ask what is past its timeout to stop, take cancel requests, mark the hung.
        Database errors propagate to the keeper, which reconnects and ticks again."""
        now = time.monotonic()
        if self.stop is not None and self.stop.is_set() and self._stop_seen is None:
            self._stop_seen = now
        slots = self.executor.running()
        if not slots:
            return
        if self._stop_seen is not None and now - self._stop_seen >= self.shutdown_grace:
            ask_to_stop(slots, STOP_SHUTDOWN)
        for slot in slots:
            if slot.stop_reason is None and now >= slot.deadline:
                if slot.request_stop(STOP_TIMEOUT):
                    _log(slot, "job_timed_out", f"ran past its timeout of {slot.timeout:g} s")
            elif slot.asked_at is not None and not slot.hung and now - slot.asked_at >= self.grace:
                self._hung(slot)
        if now >= self._next_poll:
            self._next_poll = now + CANCEL_POLL_SECONDS
            pairs = [(slot.job.id, slot.job.attempts) for slot in slots]
            cancelled = jobs_cancel_requested(worker=self.worker, running=pairs)
            for slot in slots:
                if slot.job.id in cancelled and slot.request_stop(STOP_CANCEL):
                    _log(slot, "job_cancel_seen", "was cancelled by an operator while running")
        self._loop_blocked(slots, now)
        if self.on_hung is not None and self.executor.hung.is_set():
            on_hung, self.on_hung = self.on_hung, None
            on_hung()

    def _loop_blocked(self, slots: list[Slot], now: float) -> None:
        """An async handler asked to stop, and the event loop has run nothing for the grace:
        its synchronous code blocks the loop, so no cancel can land and no other task on it
        can end. Every async slot is given up with it (the others' reason: the blocked loop),
        rather than waiting out their own timeouts on a loop that does not run."""
        stalled = self.executor.loop_stalled_for()
        if stalled < self.grace:
            return
        asked = [s for s in slots if s.is_async and s.asked_at is not None]
        if not any(now - s.asked_at >= self.grace for s in asked if s.asked_at is not None):
            return
        waiting = [s for s in slots if s.is_async and not s.hung]
        if not waiting:
            return
        logger.error(
            "the event loop of this process has run nothing for %.1f s after job(s) %s were "
            "asked to stop: an async handler is blocking it with synchronous code; its %s "
            "async job(s) are given up with it and the process retires",
            stalled,
            ", ".join(f"#{s.job.id} {s.job.kind}" for s in asked),
            len(waiting),
            extra={"action": "jobs_event_loop_blocked", "jobs": [s.job.id for s in waiting]},
        )
        for slot in waiting:
            slot.request_stop(STOP_LOOP_BLOCKED)
            self._hung(slot)

    def _hung(self, slot: Slot) -> None:
        slot.hung = True
        self.executor.hung.set()
        logger.error(
            "job #%s %s (attempt %s) did not return within JOBS_STOP_GRACE_SECONDS=%g s of "
            "being asked to stop (%s): this process stops claiming, lets its other slots "
            "finish and retires to be replaced; the job stays processing until then",
            slot.job.id,
            slot.job.kind,
            slot.job.attempts,
            self.grace,
            slot.stop_reason,
            extra={
                "action": "job_handler_hung",
                "job_id": slot.job.id,
                "kind": slot.job.kind,
                "attempt": slot.job.attempts,
                "reason": slot.stop_reason,
            },
        )


def ask_to_stop(slots: list[Slot], reason: str) -> None:
    """Ask each of `slots` to stop for `reason` (the process stopping), and log it."""
    for slot in slots:
        if slot.request_stop(reason):
            _log(slot, "job_asked_to_stop", "is asked to stop: its process is stopping")


def _log(slot: Slot, action: str, what: str) -> None:
    logger.warning(
        "job #%s %s (attempt %s) %s; %s",
        slot.job.id,
        slot.job.kind,
        slot.job.attempts,
        what,
        "its task is cancelled" if slot.is_async else "its handler is asked to stop",
        extra={
            "action": action,
            "job_id": slot.job.id,
            "kind": slot.job.kind,
            "attempt": slot.job.attempts,
        },
    )


def give_up_hung(
    executor: Executor,
    summary: RunSummary,
    config: Config,
    record_all: Callable[[list[Outcome]], object],
) -> None:
    """At a drain's end, after its other slots ended: record a hung handler that returned
    meanwhile; leave the jobs of those still running to the reaper (a short lease, the
    reason written: `job_give_up`) and mark the process to retire (jobs/retire.py)."""
    if not executor.hung.is_set():
        return
    record_all(executor.collect(timeout=0))
    for slot in executor.running():
        if slot.hung and job_give_up(
            job=slot.job,
            worker=summary.worker,
            reason=slot.stop_reason or STOP_TIMEOUT,
            seconds=slot.timeout,
            grace=config.stop_grace_seconds,
        ):
            summary.hung.append(slot.job.id)
    summary.retire = True


def retire_inline(executor: Executor, ledger: Ledger, worker: str, config: Config) -> None:
    """The one-slot drain's handler is hung, on the drain's own thread: from the keeper,
    send the completions waiting and give back the unstarted claims, leave the hung job to
    the reaper, then end the process (EXIT_RETIRED); its supervisor or django-q2's sentinel
    starts another. Never in a caller's transaction (a test's): the runner does not ask."""
    with ledger.handing_back:
        done, unstarted = ledger.take_done(), ledger.take_unstarted()
        job_runner_step(
            worker=worker,
            done=ago(done),
            release=[job.id for job in unstarted],
            durable=True,
        )
    hung = [slot for slot in executor.running() if slot.hung]
    for slot in hung:
        job_give_up(
            job=slot.job,
            worker=worker,
            reason=slot.stop_reason or STOP_TIMEOUT,
            seconds=slot.timeout,
            grace=config.stop_grace_seconds,
        )
    logger.error(
        "retiring this process (pid %s): the handler of job %s did not stop when asked; "
        "it exits to be replaced, and the job stays processing until its lease runs out",
        os.getpid(),
        ", ".join(f"#{slot.job.id}" for slot in hung),
        extra={"action": "jobs_process_retiring", "jobs": [slot.job.id for slot in hung]},
    )
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream: nothing to flush
            pass
    os._exit(EXIT_RETIRED)
