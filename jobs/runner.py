"""The job loop: claim a batch, run each handler in its own transaction, record the outcome.

The loop holds no state the database does not have: a crash at any point leaves rows
`processing` with a lease that the heartbeat stops renewing, and the reaper takes it from
there (I4). The handler's transaction is rolled back *before* a failure is recorded, and the
failure is written in a transaction of its own (I3, COR-17).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from psycopg.pq import TransactionStatus

from jobs import linger_signal, registry, selectors, services
from jobs.claim_floor import claim_floor
from jobs.conf import get_config
from jobs.exceptions import LeaseLost
from jobs.slow_kinds import slow_kinds
from processes.beacon import doing
from project.reconnect import Reconnect, connection_lost, discard_broken_connection, sleep_until
from project.redaction import redact_emails

T = TypeVar("T")

# Raised by a handler, these mean the process is stopping, not that the job failed: the
# attempt is recorded (re-queued without delay), then they propagate so the process stops.
# Every other BaseException (CancelledError, GeneratorExit, a library's own) is the job's
# failure, recorded with the backoff like any exception, and the drain goes on.
PROCESS_STOPPING = (KeyboardInterrupt, SystemExit)

logger = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What one `run_pending` call did."""

    worker: str
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0  # reaped while running: the reaped state was kept, this attempt rolled back
    released: int = 0  # claimed but given back unstarted: the drain stopped or ran out of time
    seconds: float = 0.0
    budget_exhausted: bool = False  # stopped because of limit/max_seconds
    errors: list[str] = field(default_factory=list)  # one line per failed attempt

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        rate = self.claimed / self.seconds if self.seconds else 0.0
        return (
            f"claimed={self.claimed} completed={self.completed} retried={self.retried} "
            f"failed={self.failed} lost={self.lost} released={self.released} "
            f"seconds={self.seconds:.2f} ({rate:.0f} jobs/s)"
        )


def run_pending(
    limit: int | None = None,
    *,
    max_seconds: float | None = None,
    stop: threading.Event | None = None,
    wake_others: Callable[[], object] | None = None,
    linger: float = 0.0,
) -> RunSummary:
    """Drain due jobs in this process until none is due, `limit` jobs ran, or `max_seconds`
    passed (checked before each job: a job is never started after it); return what
    happened. Reaching `max_seconds` or setting `stop` (e.g. from a SIGTERM handler) ends
    the drain after the running job; unstarted claims are released, their attempt undone.

    One statement completes the jobs run since the last one and claims the next batch
    (JOBS_CLAIM_BATCH_SIZE; issue 22, point 5). The batch's jobs start one after another at
    once; when one runs longer than JOBS_HOLD_UNSTARTED_SECONDS the drain's keeper thread
    gives the rest back to the queue (their attempt undone; the wake-up trigger tells an
    idle worker), so quick jobs never wait long behind a slow one (point 4). When a claim
    sees more due jobs than it took, `wake_others` is called (once per drain; the qcluster
    task sends a wake task, so an idle worker starts them).

    With `linger` (seconds; the qcluster task passes JOBS_LINGER_SECONDS) a drain that
    finds nothing due waits that long for a job before it returns, asking every
    JOBS_LINGER_POLL_SECONDS whether one is due (one read of the claim index, no write): a
    job enqueued meanwhile starts within that poll, not after a wake task has gone through
    django-q2's broker (issue 29, point 5).

    Call it outside any transaction (its claims must commit before handlers run).
    """
    registry.discover()
    config = get_config()
    woke_others = False
    gather_until: float | None = None  # after a small claim, the next waits until then
    summary = RunSummary(worker=services.new_worker_id())
    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    reconnect = Reconnect("job drain")
    batch = _Batch()
    # Inside a caller's transaction (a test's) the claims are seen by no other connection:
    # no other worker could start them, and the keeper's connection could not give them back.
    keeper = _Keeper(summary.worker, batch, hand_back=not connection.in_atomic_block)
    keeper.start()

    def may_start() -> bool:
        # Before every job: a run of slow handlers must not run the drain past django-q2's
        # timeout (which kills it, and the reaper would then charge the job an attempt).
        if stop is not None and stop.is_set():
            return False
        if max_seconds is not None and time.monotonic() - started >= max_seconds:
            summary.budget_exhausted = True
            return False
        return True

    def claim_size() -> int:
        if not may_start():
            return 0
        if limit is None:
            return config.claim_batch_size
        left = limit - (summary.claimed - batch.released)
        if left <= 0:
            summary.budget_exhausted = True
        return max(0, min(config.claim_batch_size, left))

    try:
        while True:
            # A completion that must be durable is sent even when the drain stops here.
            if not batch.must_send():
                if not may_start():
                    break
                running = batch.start_next()
                if running is not None:
                    job, job_started = running
                    ran = _run_one(
                        job, job_started, summary, reconnect, stop=stop, deadline=deadline
                    )
                    batch.finished(ran, job_started)
                    continue
            if (
                gather_until is not None
                and not batch.must_send()
                and not batch.has_unstarted()
                and claim_size()
            ):
                # The last claim was small: the next one waits for a batch to gather (issue
                # 36, point 2). Next to a pinned snapshot each claim re-reads the dead index
                # entries above its floor; a claim per job or two took the CPU the producers'
                # commits needed. The completions waiting go with it (a duration recorded
                # for them includes the wait, at most JOBS_CLAIM_GATHER_SECONDS).
                _wait_until(gather_until, stop=stop, deadline=deadline)
            gather_until = None
            # Send the completions: before the next job starts if one of them is not
            # idempotent (committed with the flush, I21), else with the next claim. Claim the
            # next batch only when none is left (after the keeper's hand-back in flight, if
            # any: its rows are locked until it commits).
            with batch.handing_back:
                done = batch.take_done()
                claim = 0 if batch.has_unstarted() else claim_size()
            if not claim and not done:
                if batch.has_unstarted():
                    continue
                break
            want_more = claim > 0 and wake_others is not None and not woke_others
            claim_sent = time.monotonic()
            step, resent = _send_step(
                summary.worker,
                reconnect,
                stop=stop,
                deadline=deadline,
                done=done,
                claim=claim,
                want_more=want_more,
            )
            if step is None:  # the connection stayed lost: completions unknown, reaper decides
                summary.lost += len(done)
                break
            # A step sent again after a lost answer may find its completions already made
            # by the first one; the claims of a lost answer are not in `batch`, so nothing
            # renews their lease and the reaper gives them back (issue 29, point 2).
            _count_completions(done, step.completed, summary, batch.unsure, resent=resent)
            if not claim:
                continue
            if not step.claimed:
                if _due_within(linger, config.linger_poll_seconds, stop=stop, deadline=deadline):
                    continue
                break
            batch.add(step.claimed)
            summary.claimed += len(step.claimed)
            if len(step.claimed) * 2 < config.claim_batch_size:
                gather_until = claim_sent + config.claim_gather_seconds
            if step.more_due and want_more:
                # More due jobs wait than this drain took: let an idle worker take them.
                woke_others = True
                wake_others()
    finally:
        doing("")  # issue 20 hook: idle again in the process registry
        keeper.stop()  # no statement of its own from here on
        _settle(batch, summary)
        summary.seconds = time.monotonic() - started
    if summary.claimed:
        logger.info(
            "jobs drained: %s",
            summary,
            extra={"action": "jobs_drained", **summary.as_dict()},
        )
    return summary


def _due_within(
    linger: float, poll: float, *, stop: threading.Event | None, deadline: float | None
) -> bool:
    """Wait up to `linger` seconds (never past `deadline` or `stop`) for a due job, asking
    every `poll` seconds; True when one is due. The wait ends early, False, when nothing
    is due and a django-q2 task waits for a worker (a schedule's, or a wake-up): a
    lingering drain must not keep the cluster's other work waiting."""
    until = time.monotonic() + linger
    if deadline is not None:
        until = min(until, deadline)
    while True:
        wait = min(poll, until - time.monotonic())
        if wait <= 0:
            return False
        if stop is not None:
            if stop.wait(wait):
                return False
        else:
            linger_signal.wait(wait)  # the listener's nudge ends it early
        floor = claim_floor.bound()  # as the claim's scan (issue 32, point 1)
        sent = time.monotonic()
        seen = selectors.job_due_or_task_waiting(now=timezone.now(), floor=floor)
        claim_floor.saw(
            bound=floor, seen=seen.due_run_after or seen.scanned_at, took=time.monotonic() - sent
        )
        if seen.due_run_after is not None:
            return True
        if seen.task_waiting:
            return False


def _wait_until(until: float, *, stop: threading.Event | None, deadline: float | None) -> None:
    """Sleep until monotonic `until`, never past `deadline`, ending early when `stop` is
    set: the gather before the next claim (JOBS_CLAIM_GATHER_SECONDS)."""
    if deadline is not None:
        until = min(until, deadline)
    wait = until - time.monotonic()
    if wait <= 0:
        return
    if stop is not None:
        stop.wait(wait)
    else:
        time.sleep(wait)


def _must_flush(done: list[tuple[services.ClaimedJob, float]]) -> bool:
    """Whether these completions must be committed with the WAL flush before the next job
    starts: unless every kind is declared idempotent (and JOBS_BATCH_IDEMPOTENT_COMPLETIONS
    is on), a completion lost in a crash would run its job again."""
    if not done:
        return False
    if not get_config().batch_idempotent_completions:
        return True
    return any(not registry.is_idempotent(job.kind) for job, _started in done)


def _send_step(
    worker: str,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
    done: list[tuple[services.ClaimedJob, float]],
    claim: int,
    want_more: bool,
) -> tuple[services.Step | None, bool]:
    """The drain's statement (completions, then a claim), sent again after a lost
    connection; returns the step (None if the connection stayed lost) and whether it was
    sent more than once (an earlier try may have committed with its answer lost)."""
    tries = 0

    def send() -> services.Step:
        nonlocal tries
        tries += 1
        # Issue 32, point 1: the scan starts at this process's floor (a full scan every
        # JOBS_CLAIM_FULL_SCAN_SECONDS, less often while full scans are slow), so an old
        # snapshot's dead entries below it cost no heap visit.
        floor = claim_floor.bound() if claim else None
        slow = slow_kinds.get(get_config().hold_unstarted_seconds) if claim else ()
        sent = time.monotonic()  # the statement's time, not the slow-kind read's
        step = services.job_runner_step(
            worker=worker,
            done=_ago(done),
            claim=claim,
            want_more=want_more,
            durable=_must_flush(done),
            slow_kinds=slow,
            floor=floor,
        )
        claim_floor.saw(bound=floor, seen=step.seen_floor, took=time.monotonic() - sent)
        return step

    step = _reconnecting(send, reconnect, stop=stop, deadline=deadline)
    return step, tries > 1


def _ago(done: list[tuple[services.ClaimedJob, float]]) -> list[tuple[int, float]]:
    """(id, seconds since its handler started) for the statement: a duration, so the stamp
    it writes is on the database's clock."""
    now = time.monotonic()
    return [(job.id, now - job_started) for job, job_started in done]


def _settle(batch: _Batch, summary: RunSummary) -> None:
    """At the drain's end: send the completions not sent yet and give back what was never
    started, in one statement; count what the keeper thread did."""
    done, unstarted = batch.take_done(), batch.take_unstarted()
    if done or unstarted:
        try:
            step = services.job_runner_step(
                worker=summary.worker,
                done=_ago(done),
                release=[job.id for job in unstarted],
                durable=bool(unstarted) or _must_flush(done),
            )
        except DatabaseError:  # do not mask the error that stopped us
            discard_broken_connection()
            summary.lost += len(done)
            logger.exception(
                "could not record %s completed jobs or give back %s unstarted ones; the "
                "reaper will take them after their lease",
                len(done),
                len(unstarted),
                extra={"action": "jobs_release_failed"},
            )
        else:
            _count_completions(done, step.completed, summary, batch.unsure)
            batch.released += step.released
    for job, completed in batch.settled:
        _count_completion(job, completed, summary, unsure=job.id in batch.unsure)
    summary.released = batch.released


def _count_completions(
    done: list[tuple[services.ClaimedJob, float]],
    completed: frozenset[int],
    summary: RunSummary,
    unsure: set[int],
    *,
    resent: bool = False,
) -> None:
    """Count the completions one statement sent: `completed` holds the ids it completed.
    `resent`: the statement was sent again after a lost answer; `unsure`, the ids sent in an
    earlier statement whose answer was lost (see _count_completion)."""
    for job, _started in done:
        _count_completion(job, job.id in completed, summary, unsure=resent or job.id in unsure)


def _count_completion(
    job: services.ClaimedJob, completed: bool, summary: RunSummary, *, unsure: bool = False
) -> None:
    """Count a completion sent after the handler returned; a row no longer ours was reaped.
    A completion sent again after a lost answer finds nothing to do when the lost one had
    committed: the attempt history says whether this run completed it."""
    if completed or (
        unsure
        and selectors.job_attempt_completed_by(
            job_id=job.id, number=job.attempts, worker=summary.worker
        )
    ):
        summary.completed += 1
        return
    summary.lost += 1
    logger.warning(
        "job #%s %s was reaped while running; %s",
        job.id,
        job.kind,
        "it wrote nothing in its transaction"
        if registry.runs_in_transaction(job.kind)
        else "it committed its own steps (idempotent handler)",
        extra={
            "action": "job_lease_lost",
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.attempts,
        },
    )


def _reconnecting(
    operation: Callable[[], T],
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
) -> T | None:
    """Run one of the loop's own statements; after a lost connection (server restart,
    failover, `pg_terminate_backend`) drop it, wait the logged backoff and try again, until
    `stop` is set or the drain's deadline would pass (then None). Any other database error
    is not transient here and propagates."""
    while True:
        try:
            result = operation()
        except DatabaseError as exc:
            if not connection_lost(exc):
                raise
            if not sleep_until(deadline, reconnect.failed(exc), stop):
                return None
            continue
        reconnect.recovered()
        return result


def _run_one(
    job: services.ClaimedJob,
    job_started: float,
    summary: RunSummary,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
) -> services.ClaimedJob | None:
    """Run `job`'s handler (started at monotonic `job_started`); return the job when its
    completion is left to the next statement (`job_runner_step`, one round trip for a
    batch), None when it was recorded here (completed in the handler's transaction,
    failed, or lost)."""
    context = {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}
    doing(f"job #{job.id} {job.kind}")  # issue 20 hook: the process registry's "current"
    try:
        fn = registry.get_handler(job.kind)
        if registry.runs_in_transaction(job.kind):
            # The handler's own transaction: its writes and the completion commit together.
            # If it raises, atomic() rolls back here, before the failure is recorded below.
            with transaction.atomic():
                fn(job.payload)
                if _wrote_nothing():
                    # Nothing to commit with it: the completion goes with the next claim.
                    return job
                services.job_complete(
                    job=job, worker=summary.worker, started_ago=time.monotonic() - job_started
                )
        else:
            # It commits its own steps (claim -> commit -> external effect -> record); the
            # completion goes with the next claim.
            fn(job.payload)
            return job
    except LeaseLost:
        summary.lost += 1
        logger.warning(
            "job #%s %s was reaped while running; %s",
            job.id,
            job.kind,
            "its work was rolled back"
            if registry.runs_in_transaction(job.kind)
            else "it committed its own steps (idempotent handler)",
            extra={"action": "job_lease_lost", **context},
        )
        return None
    except BaseException as exc:  # noqa: BLE001 - the loop's one catch-all: record, log, go on
        discard_broken_connection()  # the handler's atomic() has rolled back: reconnect
        outcome = _reconnecting(
            lambda exc=exc: services.job_record_failure(
                job=job, worker=summary.worker, exc=exc, started_ago=time.monotonic() - job_started
            ),
            reconnect,
            stop=None if isinstance(exc, PROCESS_STOPPING) else stop,
            deadline=deadline,
        )
        if outcome is None:  # the database stayed away: the reaper takes the row after its lease
            outcome = "lost"
        setattr(summary, outcome, getattr(summary, outcome) + 1)
        summary.errors.append(
            redact_emails(
                f"#{job.id} {job.kind}: {type(exc).__name__}: {services.exception_message(exc)}"
            )[:300]
        )
        log = logger.error if outcome == "failed" else logger.warning
        log(
            "job #%s %s attempt %s/%s %s: %s: %s",
            job.id,
            job.kind,
            job.attempts,
            job.max_attempts,
            outcome,
            type(exc).__name__,
            redact_emails(services.exception_message(exc)),
            extra={"action": f"job_{outcome}", **context},
        )
        if isinstance(exc, PROCESS_STOPPING):
            raise  # recorded; now let the process stop
        return None
    summary.completed += 1
    return None


def _wrote_nothing() -> bool:
    """Whether the open transaction has sent no statement yet (psycopg begins it lazily, at
    the first one): then there is nothing of the handler's to commit with the completion."""
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.IDLE


class _Batch:
    """The drain's claimed jobs, shared by the loop and its keeper thread under one lock:
    the ones not started yet (in claim order), the one running, and the ones run whose
    completion goes with the next statement."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handing_back = threading.Lock()  # held by the keeper while its statements run
        self.unstarted: deque[services.ClaimedJob] = deque()
        self.running: tuple[services.ClaimedJob, float] | None = None
        self.running_marked = False
        self.done: list[tuple[services.ClaimedJob, float]] = []
        self.released = 0  # given back unstarted (by the keeper or at the end)
        self.settled: list[tuple[services.ClaimedJob, bool]] = []  # completions the keeper sent
        self.unsure: set[int] = set()  # completions sent in a statement whose answer was lost
        self.flush_pending = False  # a completion in `done` must be flushed before a start

    def add(self, jobs: list[services.ClaimedJob]) -> None:
        with self.lock:
            self.unstarted.extend(jobs)

    def start_next(self) -> tuple[services.ClaimedJob, float] | None:
        with self.lock:
            if not self.unstarted:
                return None
            self.running = (self.unstarted.popleft(), time.monotonic())
            self.running_marked = False
            return self.running

    def finished(self, ran: services.ClaimedJob | None, job_started: float) -> None:
        with self.lock:
            self.running = None
            if ran is not None:
                self.done.append((ran, job_started))
                self.flush_pending = self.flush_pending or _must_flush([(ran, job_started)])

    def must_send(self) -> bool:
        """Whether a completion waiting here must be committed before the next job starts:
        a kind not declared idempotent (I21; registry.handler). Kept as a flag: asking the
        registry for each waiting job before every start cost a quarter of the loop's CPU."""
        with self.lock:
            return self.flush_pending

    def take_done_locked(self) -> list[tuple[services.ClaimedJob, float]]:
        """`take_done` for a caller that holds `lock`."""
        done, self.done = self.done, []
        self.flush_pending = False
        return done

    def put_back_done_locked(self, done: list[tuple[services.ClaimedJob, float]]) -> None:
        """Completions whose statement failed go out with the next one (`lock` held)."""
        self.done.extend(done)
        self.flush_pending = _must_flush(self.done)

    def has_unstarted(self) -> bool:
        with self.lock:
            return bool(self.unstarted)

    def held_ids(self) -> list[int]:
        """The rows this drain knows it holds: the keeper renews these leases only. A row
        claimed by a statement whose answer was lost, or given back by one, is not here:
        its lease runs out and the reaper decides (issue 29, point 2)."""
        with self.lock:
            ids = [job.id for job in self.unstarted]
            ids.extend(job.id for job, _started in self.done)
            if self.running is not None:
                ids.append(self.running[0].id)
            return ids

    def take_done(self) -> list[tuple[services.ClaimedJob, float]]:
        with self.lock:
            return self.take_done_locked()

    def take_unstarted(self) -> list[services.ClaimedJob]:
        with self.lock:
            unstarted = list(self.unstarted)
            self.unstarted.clear()
            return unstarted


class _Keeper(threading.Thread):
    """The drain's second thread, on its own connection: it renews the lease of every row
    the drain holds, and when the running job has run longer than
    JOBS_HOLD_UNSTARTED_SECONDS it gives the batch's unstarted jobs back to the queue, sends
    the completions waiting behind it, and marks it started (its start and its attempt show
    while it runs).

    A thread, not a call handlers must remember: a long handler keeps its lease however it
    is written, and a dead process stops renewing, which is exactly what the reaper needs.
    """

    def __init__(self, worker: str, batch: _Batch, *, hand_back: bool = True) -> None:
        super().__init__(name=f"jobs-keeper-{worker}", daemon=True)
        self.worker = worker
        self.batch = batch
        self.hand_back = hand_back
        self._stopped = threading.Event()

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
                        services.job_heartbeat(worker=self.worker, job_ids=self.batch.held_ids())
                    except Exception as exc:  # noqa: BLE001 - the keeper's catch-all: reconnect, beat again soon
                        next_beat = time.monotonic() + reconnect.failed(exc)
                        continue
                    reconnect.recovered()
                    next_beat = time.monotonic() + interval
                if self.hand_back:
                    with self.batch.handing_back:
                        self._hand_back_if_held(hold)
        finally:
            connection.close()

    def _hand_back_if_held(self, hold: float) -> None:
        batch = self.batch
        with batch.lock:
            running = batch.running
            if running is None or time.monotonic() - running[1] < hold:
                return
            if batch.running_marked and not batch.unstarted and not batch.done:
                return
            release = list(batch.unstarted)
            batch.unstarted.clear()
            slow_kinds.saw_slow(running[0].kind)
            done = batch.take_done_locked()
            mark = None if batch.running_marked else running
            batch.running_marked = True
        try:
            if release or done:
                # Apart from the mark: this statement must not lock the running job's row,
                # which the handler's own transaction takes last (job_complete) while it may
                # hold a counter shard this statement's triggers wait for.
                step = services.job_runner_step(
                    worker=self.worker,
                    done=_ago(done),
                    release=[job.id for job in release],
                    durable=True,
                )
                with batch.lock:
                    batch.released += step.released
                    batch.settled.extend((job, job.id in step.completed) for job, _s in done)
                if step.released:
                    logger.info(
                        "gave back %s unstarted jobs while job #%s %s runs",
                        step.released,
                        running[0].id,
                        running[0].kind,
                        extra={"action": "jobs_given_back", "job_id": running[0].id},
                    )
                release, done = [], []  # settled: nothing to keep below
            if mark is not None:
                services.job_runner_step(
                    worker=self.worker, mark=(mark[0].id, time.monotonic() - mark[1])
                )
        except Exception as exc:  # noqa: BLE001 - the keeper's catch-all: keep what is safe, try next tick
            discard_broken_connection()
            with batch.lock:
                # The statement may have committed with its answer lost: the jobs it gave
                # back may be queued again (another worker's, or this drain's next claim),
                # so they are never started from here; if it did not commit they are still
                # this run's, unrenewed, and the reaper re-queues them after their lease. The
                # completions are sent again (guarded: a second one changes nothing).
                batch.put_back_done_locked(done)
                batch.unsure.update(job.id for job, _s in done)
                if batch.running is running:
                    batch.running_marked = False
            logger.warning(
                "could not give back %s unstarted jobs behind job #%s (%s); they are left "
                "to their lease and the reaper",
                len(release),
                running[0].id,
                exc,
                extra={
                    "action": "jobs_give_back_failed",
                    "job_id": running[0].id,
                    "jobs": len(release),
                },
            )
