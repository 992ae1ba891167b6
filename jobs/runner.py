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
from dataclasses import asdict, dataclass, field

from django.db import DatabaseError, connection, transaction

from jobs import registry, services
from jobs.conf import get_config
from jobs.exceptions import LeaseLost
from project.redaction import redact_emails

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
    batch_size: int | None = None,
    stop: threading.Event | None = None,
) -> RunSummary:
    """Drain due jobs in this process until none is due, `limit` jobs ran, or `max_seconds`
    passed (checked before each job: a job is never started after it); return what
    happened. Reaching `max_seconds` or setting `stop` (e.g. from a SIGTERM handler) ends
    the drain after the running job; unstarted claims are released, their attempt undone.

    Call it outside any transaction (its claims must commit before handlers run).
    """
    registry.discover()
    batch_size = batch_size or get_config().claim_batch_size
    summary = RunSummary(worker=services.new_worker_id())
    started = time.monotonic()
    pending: deque[services.ClaimedJob] = deque()
    heartbeat = _Heartbeat(summary.worker)
    heartbeat.start()
    try:
        while stop is None or not stop.is_set():
            # Before every job, not only before a claim: a batch of slow handlers must
            # not run the drain past django-q2's timeout (which kills it, and the reaper
            # would then charge each unstarted claim an attempt). What is left is
            # released below and picked up by the next drain.
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                summary.budget_exhausted = True
                break
            if not pending:
                remaining = None if limit is None else limit - summary.claimed
                if remaining is not None and remaining <= 0:
                    summary.budget_exhausted = True
                    break
                size = batch_size if remaining is None else min(batch_size, remaining)
                pending.extend(services.job_claim_batch(worker=summary.worker, limit=size))
                summary.claimed += len(pending)
                if not pending:
                    break
            _run_one(pending.popleft(), summary)
    finally:
        heartbeat.stop()
        if pending:  # deadline, stop request, interrupt or database error: give them back
            try:
                summary.released = services.job_release(
                    worker=summary.worker, job_ids=[job.id for job in pending]
                )
            except DatabaseError:  # do not mask the error that stopped us
                logger.exception(
                    "could not release %s unstarted jobs; the reaper will reclaim them",
                    len(pending),
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


def _run_one(job: services.ClaimedJob, summary: RunSummary) -> None:
    context = {"job_id": job.id, "kind": job.kind, "attempt": job.attempts}
    try:
        fn = registry.get_handler(job.kind)
        # The handler's own transaction: its writes and the completion commit together.
        # If it raises, atomic() rolls back here, before the failure is recorded below.
        with transaction.atomic():
            fn(job.payload)
            services.job_complete(job=job, worker=summary.worker)
    except LeaseLost:
        summary.lost += 1
        logger.warning(
            "job #%s %s was reaped while running; its work was rolled back",
            job.id,
            job.kind,
            extra={"action": "job_lease_lost", **context},
        )
        return
    except BaseException as exc:  # noqa: BLE001 - the loop's one catch-all: record, log, go on
        _ensure_usable_connection()
        outcome = services.job_record_failure(job=job, worker=summary.worker, exc=exc)
        setattr(summary, outcome, getattr(summary, outcome) + 1)
        summary.errors.append(
            redact_emails(f"#{job.id} {job.kind}: {type(exc).__name__}: {exc}")[:300]
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
            redact_emails(str(exc)),
            extra={"action": f"job_{outcome}", **context},
        )
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt / SystemExit: recorded, now let the process stop
        return
    summary.completed += 1


def _ensure_usable_connection() -> None:
    """After a lost connection (server restart, network) reconnect before recording."""
    if (
        not connection.in_atomic_block
        and connection.connection is not None
        and connection.errors_occurred
        and not connection.is_usable()
    ):
        connection.close()


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
        try:
            while not self._stopped.wait(get_config().heartbeat_seconds):
                try:
                    services.job_heartbeat(worker=self.worker)
                except Exception:  # noqa: BLE001 - the heartbeat loop's catch-all; next beat retries
                    logger.exception(
                        "job heartbeat failed for %s",
                        self.worker,
                        extra={"action": "job_heartbeat_failed"},
                    )
        finally:
            connection.close()
