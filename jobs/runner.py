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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from django.db import DatabaseError, connection, transaction
from psycopg.pq import TransactionStatus

from jobs import registry, services
from jobs.conf import get_config
from jobs.exceptions import LeaseLost
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
) -> RunSummary:
    """Drain due jobs in this process until none is due, `limit` jobs ran, or `max_seconds`
    passed (checked before each job: a job is never started after it); return what
    happened. Reaching `max_seconds` or setting `stop` (e.g. from a SIGTERM handler) ends
    the drain after the running job; unstarted claims are released, their attempt undone.

    Jobs are claimed one at a time, each right before it starts (issue 22): a worker never
    holds a job another worker could start. When a claim sees another due job waiting,
    `wake_others` is called (once per drain; the qcluster task sends a wake task, so an
    idle worker starts it instead of it waiting behind this drain's job).

    Call it outside any transaction (its claims must commit before handlers run).
    """
    registry.discover()
    woke_others = False
    summary = RunSummary(worker=services.new_worker_id())
    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    reconnect = Reconnect("job drain")
    unstarted: services.ClaimedJob | None = None  # claimed, not started yet: given back below
    ran: services.ClaimedJob | None = None  # handler done, completion goes with the next claim
    heartbeat = _Heartbeat(summary.worker)
    heartbeat.start()

    def may_claim() -> bool:
        # Before every job, not only before a claim: a run of slow handlers must not run the
        # drain past django-q2's timeout (which kills it, and the reaper would then charge
        # the job an attempt).
        if stop is not None and stop.is_set():
            return False
        if max_seconds is not None and time.monotonic() - started >= max_seconds:
            summary.budget_exhausted = True
            return False
        if limit is not None and summary.claimed >= limit:
            summary.budget_exhausted = True
            return False
        return True

    try:
        while True:
            claim = may_claim()
            if not claim and ran is None:
                break
            done, want_more = ran, wake_others is not None and not woke_others
            step = _reconnecting(
                lambda done=done, claim=claim, want_more=want_more: services.job_finish_and_claim(
                    worker=summary.worker, done=done, claim=claim, want_more=want_more
                ),
                reconnect,
                stop=stop,
                deadline=deadline,
            )
            ran = None
            if step is None:  # the connection stayed lost until stop/deadline
                if done is not None:  # its completion is unknown: the reaper decides
                    summary.lost += 1
                break
            if done is not None:
                _count_completion(done, step.completed, summary)
            if step.claimed is None:
                break
            unstarted = step.claimed
            summary.claimed += 1
            if step.more_due and want_more:
                # Another due job waits while this one runs: let an idle worker take it
                # rather than have it wait behind this one (head-of-line blocking).
                woke_others = True
                wake_others()
            job, unstarted = unstarted, None
            ran = _run_one(job, summary, reconnect, stop=stop, deadline=deadline)
    finally:
        doing("")  # issue 20 hook: idle again in the process registry
        if ran is not None:  # interrupted before its completion was sent: send it alone
            try:
                step = services.job_finish_and_claim(
                    worker=summary.worker, done=ran, claim=False, want_more=False
                )
                _count_completion(ran, step.completed, summary)
            except DatabaseError:  # do not mask the error that stopped us
                summary.lost += 1
                logger.exception(
                    "could not record job #%s completed; the reaper will run it again",
                    ran.id,
                    extra={"action": "job_complete_failed", "job_id": ran.id, "kind": ran.kind},
                )
        heartbeat.stop()
        if unstarted is not None:  # claimed, then stopped before it started: give it back
            try:
                summary.released = services.job_release(
                    worker=summary.worker, job_ids=[unstarted.id]
                )
            except DatabaseError:  # do not mask the error that stopped us
                logger.exception(
                    "could not release unstarted job #%s; the reaper will reclaim it",
                    unstarted.id,
                    extra={"action": "jobs_release_failed"},
                )
        summary.seconds = time.monotonic() - started
    if summary.claimed:
        logger.info(
            "jobs drained: %s",
            summary,
            extra={"action": "jobs_drained", **summary.as_dict()},
        )
    return summary


def _count_completion(job: services.ClaimedJob, completed: bool, summary: RunSummary) -> None:
    """Count a completion sent after the handler returned; a row no longer ours was reaped."""
    if completed:
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
    summary: RunSummary,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
) -> services.ClaimedJob | None:
    """Run `job`'s handler; return the job when its completion is left to the next
    statement (`job_finish_and_claim`, one round trip for both), None when it was recorded
    here (completed in the handler's transaction, failed, or lost)."""
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
                services.job_complete(job=job, worker=summary.worker)
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
            lambda exc=exc: services.job_record_failure(job=job, worker=summary.worker, exc=exc),
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


class _Heartbeat(threading.Thread):
    """Renews the lease of every row this run holds while the process is alive.

    A thread, not a call handlers must remember: a long handler keeps its lease however it
    is written, and a dead process stops renewing, which is exactly what the reaper needs.
    """

    def __init__(self, worker: str) -> None:
        super().__init__(name=f"jobs-heartbeat-{worker}", daemon=True)
        self.worker = worker
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=10)

    def run(self) -> None:
        # This thread has its own connection. After a failure it is dropped if broken (Django
        # would otherwise reuse the dead one on every beat until the lease ran out and the
        # reaper took the live job, D4) and the next beat comes after a backoff that is never
        # longer than the beat itself (cap plus its 25 % jitter), so an outage shorter than
        # the lease costs no lease.
        interval = get_config().heartbeat_seconds
        reconnect = Reconnect(f"job heartbeat {self.worker}", base=interval / 4, cap=interval * 0.8)
        wait = interval
        try:
            while not self._stopped.wait(wait):
                try:
                    services.job_heartbeat(worker=self.worker)
                except Exception as exc:  # noqa: BLE001 - the heartbeat loop's catch-all: reconnect, beat again soon
                    wait = reconnect.failed(exc)
                    continue
                reconnect.recovered()
                wait = interval
        finally:
            connection.close()
