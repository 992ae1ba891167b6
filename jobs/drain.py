"""The drain's loop (`Drain`, one per `run_pending` call): when to start a claimed job, when
to claim and when to send the completions, for the one-slot drain (each job on the drain's
thread, a batch at a time) and for thread slots and the event loop. Apart from
`run_pending` (jobs/runner.py), which sets a drain up (its ledger, executor, supervisor and
keeper) and tears it down, because this is the one place that decides when to send: it owns
the drain's connection, and every statement of the drain's but the keeper's goes through
`Drain.send`.

The loop holds no state the database does not have: a crash at any point leaves rows
`processing` with a lease that the heartbeat stops renewing, and the reaper takes it from
there (I4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError

from jobs.completer import RunSummary, count_completions, record
from jobs.conf import get_config
from jobs.ledger import ASYNC, THREAD, Done, Ledger
from jobs.producer import due_now, due_within, reconnecting, send_step, wait_until
from jobs.runner_step import Step
from jobs.slots import Executor
from processes.beacon import doing, using_slots
from project.reconnect import Reconnect

logger = logging.getLogger(__name__)

FRUITLESS_POLL_MAX_SECONDS = 0.4  # the longest wait between claims that find nothing to fit


class Drain:
    """One `run_pending` call's loop and what it decides with: when to start, claim, send."""

    def __init__(
        self,
        summary: RunSummary,
        ledger: Ledger,
        executor: Executor,
        *,
        limit: int | None,
        max_seconds: float | None,
        stop: threading.Event | None,
        wake_others: Callable[[], object] | None,
        linger: float,
    ) -> None:
        self.config = get_config()
        self.summary, self.ledger, self.executor = summary, ledger, executor
        self.limit, self.max_seconds, self.stop = limit, max_seconds, stop
        self.wake_others, self.linger = wake_others, linger
        self.started = time.monotonic()
        self.deadline = None if max_seconds is None else self.started + max_seconds
        self.reconnect = Reconnect("job drain")
        self.woke_others = False
        self.gather_until: float | None = None  # after a small claim, the next waits until then
        self.fruitless = 0  # polls in a row that found jobs due and claimed none
        self.poll_claim_at = 0.0  # the next poll's claim not before (monotonic)
        # With slots, a claim may take a batch past the free thread slots for the kinds
        # nothing limits (migration 0028): a step's server cost is about fixed, so ten jobs
        # a step cost nearly twice what twenty do (issue 37, point 4). Not in a process
        # with reserved slots: a backfill held unstarted there would keep a reserved kind's
        # next job waiting until it is started or given back (point 3).
        self.beyond = 0 if executor.inline or ledger.reserved else self.config.claim_batch_size

    # --- the one-slot drain: each job on this thread, a batch at a time --------------------

    def run_inline(self) -> BaseException | None:
        ledger = self.ledger
        while True:
            # A completion that must be durable is sent even when the drain stops here.
            if not ledger.must_send():
                if not self.may_start():
                    return None
                running = ledger.start_next()
                if running is not None:
                    job, job_started = running
                    doing(f"job #{job.id} {job.kind}")  # issue 20 hook: "current"
                    self.executor.start(job, job_started)
                    stopping = self.take_outcomes()
                    if stopping is not None:
                        return stopping
                    continue
            if self.gather_until is not None and not ledger.must_send():
                if not ledger.has_unstarted() and self.claim_size():
                    # The last claim was small: the next one waits for a batch to gather
                    # (issue 36, point 2); the completions waiting go with it.
                    wait_until(self.gather_until, stop=self.stop, deadline=self.deadline)
            self.gather_until = None
            # Claim the next batch only when none is left (after the keeper's hand-back in
            # flight, if any: its rows are locked until it commits).
            with ledger.handing_back:
                done = ledger.take_done()
                claim = 0 if ledger.has_unstarted() else self.claim_size()
            if not claim and not done:
                if ledger.has_unstarted():
                    continue
                return None
            step = self.send(done, claim)
            if step is None:
                return None
            if claim and not step.claimed and not self.due_within_linger():
                return None

    # --- thread slots and the event loop ------------------------------------------------------

    def run_slots(self) -> BaseException | None:
        ledger, config = self.ledger, self.config
        queue_empty = False  # the last claim took less than its free slots could start
        # A claim takes what the free slots can start (`Ledger.room`, migration 0024), and
        # past them only jobs of kinds nothing limits (`beyond`, 0028): a capped or reserved
        # kind's claimed job never waits for a slot, and jobs that fit none stay queued.
        while True:
            stopping = self.take_outcomes()
            if stopping is not None:
                return stopping
            if self.ending():
                return None  # let_slots_end waits for the running slots (their grace)
            self.start_what_can_start()
            # Over when nothing runs and nothing claimed may start: with its time up, the
            # unstarted claims go back as it ends (`settle`). Else it waited for outcomes
            # that could not come until Q_TIMEOUT killed it (the keeper gives back only
            # behind a running job).
            idle = not ledger.has_running() and (not ledger.has_unstarted() or not self.may_start())
            with ledger.handing_back:
                unstarted = ledger.has_unstarted()
                free = self.free_after_send()
                # Claim when half the thread slots (at most half a batch) are free, or none
                # runs: a few statements for many slots, not one per slot that ends.
                enough = free >= max(1, min(config.claim_batch_size, ledger.capacity[THREAD]) // 2)
                want = 0 if unstarted else self.claim_size(self.with_beyond(free))
                if ledger.must_send():
                    claim = 0 if queue_empty else want
                elif want and (idle or (enough and not queue_empty)):
                    claim = want
                else:
                    claim = -1  # nothing to send now
                if claim >= 0:
                    if claim and idle and self.gather_until is not None:
                        wait_until(self.gather_until, stop=self.stop, deadline=self.deadline)
                        free = self.free_after_send()
                        claim = self.claim_size(self.with_beyond(free))
                    self.gather_until = None
                    done = ledger.take_done()
            if claim >= 0:
                step = self.send(done, claim)
                if step is None:
                    return None
                if claim:
                    queue_empty = len(step.claimed) < min(claim, free)
                    if idle and not step.claimed and not self.due_within_linger():
                        return None
                continue
            if idle:
                return None  # nothing runs and nothing may be claimed: the drain is over
            # Wait for a slot to end; meanwhile ask every poll whether a job came.
            stopping = self.take_outcomes(timeout=config.linger_poll_seconds)
            if stopping is not None:
                return stopping
            if (
                self.last_took_nothing
                and queue_empty
                and want
                and self.may_start()
                and time.monotonic() >= self.poll_claim_at
            ):
                queue_empty = not self.due_now()
                if not queue_empty or ledger.done:
                    step = self.send_now(want if not queue_empty else 0)
                    if not queue_empty and step is not None:
                        queue_empty = len(step.claimed) < min(want, free)
                        if not step.claimed:
                            self.claimed_nothing_due()

    def claimed_nothing_due(self) -> None:
        """Jobs are due but none fits a free slot (the busy slots' kinds, a reserved kind's
        backlog): ask again less often, up to every FRUITLESS_POLL_MAX_SECONDS, until a slot
        frees or a claim takes something (each poll was a statement every 50 ms)."""
        self.fruitless += 1
        wait = self.config.linger_poll_seconds * 2**self.fruitless
        self.poll_claim_at = time.monotonic() + min(wait, FRUITLESS_POLL_MAX_SECONDS)

    def send_now(self, claim: int) -> Step | None:
        with self.ledger.handing_back:
            done = self.ledger.take_done()
        return self.send(done, claim)

    def start_what_can_start(self) -> None:
        if not self.may_start():
            return
        while (running := self.ledger.start_next()) is not None:
            self.executor.start(*running)
        slots = self.executor.slots
        if slots:
            first = next(iter(slots.values())).job
            more = f" and {len(slots) - 1} more" if len(slots) > 1 else ""
            doing(f"job #{first.id} {first.kind}{more}")  # issue 20 hook: "current"
        else:
            doing("")
        self.report_slots()

    def report_slots(self) -> None:
        """The beacon's slots figure (issue 37, point 10): total and in use per kind."""
        ledger = self.ledger
        using_slots(
            threads=ledger.capacity[THREAD], async_tasks=ledger.capacity[ASYNC],
            busy=ledger.in_use(),
        )  # fmt: skip

    def with_beyond(self, free: int) -> int:
        """What a claim may ask for with `free` slots: past them by `beyond` while one is
        free (the statement keeps every limited kind to the free slots)."""
        return free + self.beyond if free > 0 else 0

    def free_after_send(self) -> int:
        """Slots free once the completions waiting are sent (the claim goes with them)."""
        ledger = self.ledger
        with ledger.lock:
            return sum(ledger.capacity.values()) - sum(ledger.busy.values()) + len(ledger.holding)

    # --- shared ---------------------------------------------------------------------------

    last_took_nothing = True

    def take_outcomes(self, timeout: float = 0.0) -> BaseException | None:
        """Record what the slots finished (waiting up to `timeout` for the first)."""
        outcomes = self.executor.collect(timeout=timeout)
        self.last_took_nothing = not outcomes
        if outcomes:
            self.fruitless, self.poll_claim_at = 0, 0.0  # a slot frees: claim as usual
        stopping = None
        for outcome in outcomes:
            stopping = record(
                outcome, self.ledger, self.summary, self.reconnect,
                stop=self.stop, deadline=self.deadline,
            ) or stopping  # fmt: skip
        return stopping

    def ending(self) -> bool:
        """Stopped (SIGTERM) or a handler hung: claim nothing more, start nothing more."""
        return (self.stop is not None and self.stop.is_set()) or self.executor.hung.is_set()

    def let_slots_end(self) -> None:
        """Before the drain ends: wait for the handlers still running (their leases renewed
        by the keeper meanwhile; on SIGTERM the supervisor asks them to stop after
        JOBS_SHUTDOWN_GRACE_SECONDS) and record them, but not for a hung one, which only
        the process's end stops. Completions are sent as they come: a deploy's stop killed
        mid-way must not re-run a job that finished (the rest go with the last statement,
        completer.settle)."""
        executor = self.executor
        while not executor.inline and any(not slot.hung for slot in executor.running()):
            self.record_all(executor.collect(timeout=0.2))
            if self.ledger.done:
                try:
                    self.send_now(0)
                except DatabaseError:
                    logger.exception(
                        "could not send %s completions while the slots end; sent again at "
                        "the drain's end",
                        len(self.ledger.done),
                        extra={"action": "jobs_send_failed"},
                    )

    def record_all(self, outcomes: list) -> None:
        for outcome in outcomes:
            try:
                record(outcome, self.ledger, self.summary, self.reconnect, stop=self.stop,
                       deadline=self.deadline)  # fmt: skip
            except DatabaseError:  # do not mask the error that stopped us
                logger.exception(
                    "could not record the outcome of job #%s; the reaper will take it",
                    outcome.job.id,
                    extra={"action": "job_record_failed", "job_id": outcome.job.id},
                )

    def may_start(self) -> bool:
        # Before every job: a run of slow handlers must not run the drain past django-q2's
        # timeout (which kills it, and the reaper would then charge the job an attempt).
        if self.ending():
            return False
        if self.max_seconds is not None and time.monotonic() - self.started >= self.max_seconds:
            self.summary.budget_exhausted = True
            return False
        return True

    def claim_size(self, free: int | None = None) -> int:
        if not self.may_start():
            return 0
        size = self.config.claim_batch_size if free is None else min(
            self.config.claim_batch_size, free
        )  # fmt: skip
        if self.limit is not None:
            left = self.limit - (self.summary.claimed - self.ledger.released)
            if left <= 0:
                self.summary.budget_exhausted = True
            size = min(size, left)
        return max(0, size)

    def send(self, done: list[Done], claim: int) -> Step | None:
        """Send the completions and the claim; start nothing. None: the connection stayed
        lost (completions unknown, the reaper decides)."""
        want_more = claim > 0 and self.wake_others is not None and not self.woke_others
        claim_sent = time.monotonic()
        step, resent = send_step(
            self.summary.worker, self.reconnect, stop=self.stop, deadline=self.deadline,
            done=done, claim=claim, want_more=want_more,
            # With slots every claimed job starts at once: no kind is slow to wait behind.
            slow=self.executor.inline,
            # With slots the claim takes only what the free slots can start (each kind's
            # own reserved slots, then the shared ones: migration 0024).
            room=None if self.executor.inline else self.ledger.room,
            beyond=self.beyond,
        )  # fmt: skip
        self.ledger.sent(done)
        if step is None:
            self.summary.lost += len(done)
            return None
        # A step sent again after a lost answer may find its completions already made
        # by the first one; the claims of a lost answer are not in the ledger, so nothing
        # renews their lease and the reaper gives them back (issue 29, point 2).
        count_completions(done, step.completed, self.summary, self.ledger.unsure, resent=resent)
        if step.claimed:
            self.fruitless, self.poll_claim_at = 0, 0.0
            self.ledger.add(step.claimed)
            self.summary.claimed += len(step.claimed)
            if len(step.claimed) * 2 < self.config.claim_batch_size:
                self.gather_until = claim_sent + self.config.claim_gather_seconds
            if step.more_due and want_more:
                # More due jobs wait than this drain took: let an idle worker take them.
                self.woke_others = True
                assert self.wake_others is not None
                self.wake_others()
        return step

    def due_now(self) -> bool:
        """One read: is a job due? After a lost connection it reconnects as the drain's
        other statements do (an error here once ended the drain, and the completions of the
        slots still running were then left to the reaper: issue 37, point 5); False when it
        gives up (stopping, or past the deadline)."""
        return bool(reconnecting(due_now, self.reconnect, stop=self.stop, deadline=self.deadline))

    def due_within_linger(self) -> bool:
        return bool(
            reconnecting(
                lambda: due_within(
                    self.linger, self.config.linger_poll_seconds, stop=self.stop,
                    deadline=self.deadline,
                ),
                self.reconnect, stop=self.stop, deadline=self.deadline,
            )
        )  # fmt: skip
