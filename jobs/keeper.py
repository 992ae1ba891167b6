"""The drain's keeper thread, on its own connection: it renews the lease of every row the
drain holds (every running slot's, the unstarted claims', the completions not sent yet),
marks each job that has run longer than JOBS_HOLD_UNSTARTED_SECONDS started (its start and
its attempt show while it runs), and gives the unstarted claims back to the queue when no
slot has started one for that long.

A thread, not a call handlers must remember: a long handler keeps its lease however it
is written, and a dead process stops renewing, which is exactly what the reaper needs. It
also ticks the drain's supervisor (jobs/stopping.py: timeouts, cancel requests, hung
handlers), since the drain's own thread may be the one running a handler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection

from jobs.conf import get_config
from jobs.ledger import Done, Ledger
from jobs.outcomes import job_heartbeat, jobs_mark_started
from jobs.runner_step import job_runner_step
from jobs.slow_kinds import slow_kinds
from project.reconnect import Reconnect, discard_broken_connection

logger = logging.getLogger(__name__)


def ago(done: list[Done]) -> list[tuple[int, float]]:
    """(id, seconds since its handler started) for the statement: a duration, so the stamp
    it writes is on the database's clock."""
    now = time.monotonic()
    return [(job.id, now - job_started) for job, job_started in done]


class Keeper(threading.Thread):
    """`send_done`: the keeper also sends the completions waiting behind a long job (the
    one-slot drain, whose thread is the one running it); with thread slots the drain
    thread is free to send them itself."""

    def __init__(
        self,
        worker: str,
        ledger: Ledger,
        *,
        hand_back: bool = True,
        send_done: bool = True,
        supervise: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(name=f"jobs-keeper-{worker}", daemon=True)
        self.worker = worker
        self.ledger = ledger
        self.hand_back = hand_back
        self.send_done = send_done
        self.supervise = supervise  # the supervisor's tick (jobs/stopping.py)
        self._stopped = threading.Event()
        self._supervise_failures = 0

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=10)

    def run(self) -> None:
        # After a failure the connection is dropped if broken (Django would otherwise reuse
        # the dead one on every beat until the lease ran out and the reaper took the live
        # job, D4) and the next beat comes after a backoff that is never longer than the
        # beat itself (cap plus its 25 % jitter), so an outage shorter than the lease costs
        # no lease.
        config = get_config()
        interval, hold = config.heartbeat_seconds, config.hold_unstarted_seconds
        reconnect = Reconnect(f"job heartbeat {self.worker}", base=interval / 4, cap=interval * 0.8)
        next_beat = time.monotonic() + interval
        try:
            while not self._stopped.wait(min(hold / 2, max(0.0, next_beat - time.monotonic()))):
                if time.monotonic() >= next_beat:
                    try:
                        job_heartbeat(worker=self.worker, job_ids=self.ledger.held_ids())
                    except Exception as exc:  # noqa: BLE001 - the keeper's catch-all: reconnect, beat again soon
                        next_beat = time.monotonic() + reconnect.failed(exc)
                        continue
                    reconnect.recovered()
                    next_beat = time.monotonic() + interval
                if self.supervise is not None:
                    self._supervise()
                if self.hand_back:
                    with self.ledger.handing_back:
                        self._hand_back_if_held(hold)
        finally:
            connection.close()

    def _supervise(self) -> None:
        assert self.supervise is not None
        try:
            self.supervise()
        except Exception as exc:  # noqa: BLE001 - the keeper's catch-all: reconnect, tick again
            discard_broken_connection()
            self._supervise_failures += 1
            if self._supervise_failures in (1, 10) or self._supervise_failures % 100 == 0:
                logger.warning(
                    "could not check the running jobs for timeouts and cancels (%s; %s "
                    "times); trying again at the next tick",
                    exc,
                    self._supervise_failures,
                    extra={"action": "jobs_supervise_failed"},
                )
        else:
            self._supervise_failures = 0

    def _hand_back_if_held(self, hold: float) -> None:
        ledger = self.ledger
        now = time.monotonic()
        with ledger.lock:
            long = [
                (job, started)
                for job, started in ledger.running.values()
                if now - started >= hold and job.id not in ledger.marked
            ]
            held = bool(ledger.running) and now - ledger.last_start >= hold
            release = list(ledger.unstarted) if held else []
            ledger.unstarted.clear() if held else None
            done = ledger.take_done_locked() if held and self.send_done else []
            ledger.marked.update(job.id for job, _started in long)
        for job, _started in long:
            slow_kinds.saw_slow(job.kind)
        try:
            if release or done:
                # Apart from the marks: this statement must not lock a running job's row,
                # which the handler's own transaction takes last (job_complete) while it may
                # hold a counter shard this statement's triggers wait for.
                step = job_runner_step(
                    worker=self.worker,
                    done=ago(done),
                    release=[job.id for job in release],
                    durable=True,
                )
                ledger.sent(done)
                with ledger.lock:
                    ledger.released += step.released
                    ledger.settled.extend((job, job.id in step.completed) for job, _s in done)
                if step.released:
                    logger.info(
                        "gave back %s unstarted jobs while %s jobs run",
                        step.released,
                        len(ledger.running),
                        extra={"action": "jobs_given_back", "jobs": step.released},
                    )
                release, done = [], []  # settled: nothing to keep below
            if long:
                # One statement for every slot that crossed the hold since the last tick.
                # Not a row that is locked: then the reaper is taking it or the handler
                # completing it, and the mark would only queue behind them.
                now = time.monotonic()
                jobs_mark_started(
                    worker=self.worker, started=[(job.id, now - started) for job, started in long]
                )
                long = []
        except Exception as exc:  # noqa: BLE001 - the keeper's catch-all: keep what is safe, try next tick
            discard_broken_connection()
            with ledger.lock:
                # The statement may have committed with its answer lost: the jobs it gave
                # back may be queued again (another worker's, or this drain's next claim),
                # so they are never started from here; if it did not commit they are still
                # this run's, unrenewed, and the reaper re-queues them after their lease. The
                # completions are sent again (guarded: a second one changes nothing).
                ledger.put_back_done_locked(done)
                ledger.unsure.update(job.id for job, _s in done)
                ledger.marked.difference_update(job.id for job, _s in long)
            logger.warning(
                "could not give back %s unstarted jobs (%s); they are left to their lease "
                "and the reaper",
                len(release),
                exc,
                extra={"action": "jobs_give_back_failed", "jobs": len(release)},
            )
