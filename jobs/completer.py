"""The completer (issue 37): records what the slots' handlers did, on the drain's
connection. A failure is written at once, in a transaction of its own, after the handler's
transaction was rolled back (I3, COR-17); a completion waits in the ledger for the drain's
next statement, so the completions of every slot that ended meanwhile share one round trip
and one commit (flushed unless every kind in it is declared idempotent, I21).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field

from django.db import DatabaseError, connection

from jobs import registry, selectors
from jobs.conf import get_config
from jobs.exceptions import Snooze
from jobs.handler_run import Outcome
from jobs.keeper import ago
from jobs.ledger import Done, Ledger, must_flush
from jobs.outcomes import exception_message, job_record_failure
from jobs.producer import reconnecting
from jobs.runner_step import ClaimedJob, Step, job_runner_step
from jobs.snoozing import spent_reason
from jobs.stops import STOP_CANCEL, STOP_TIMEOUT, job_record_stopped
from project.reconnect import Reconnect, connection_lost, discard_broken_connection
from project.redaction import redact_emails

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
    snoozed: int = 0  # a handler raised jobs.Snooze: queued again, no attempt spent
    lost: int = 0  # reaped while running: the reaped state was kept, this attempt rolled back
    released: int = 0  # claimed but given back unstarted: the drain stopped or ran out of time
    seconds: float = 0.0
    budget_exhausted: bool = False  # stopped because of limit/max_seconds
    errors: list[str] = field(default_factory=list)  # one line per failed attempt
    timed_out: int = 0  # handlers past their timeout, stopped (also counted retried/failed)
    cancelled: int = 0  # cancelled by an operator while running, once their handler stopped
    # Handlers that did not return when asked (issue 37, point 6): their jobs were left
    # `processing` for the reaper, and `retire` says this process must exit to be replaced.
    hung: list[int] = field(default_factory=list)
    retire: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        rate = self.claimed / self.seconds if self.seconds else 0.0
        return (
            f"claimed={self.claimed} completed={self.completed} retried={self.retried} "
            f"failed={self.failed} snoozed={self.snoozed} lost={self.lost} "
            f"released={self.released} timed_out={self.timed_out} "
            f"cancelled={self.cancelled} "
            f"seconds={self.seconds:.2f} ({rate:.0f} jobs/s)"
        )


def record(
    outcome: Outcome,
    ledger: Ledger,
    summary: RunSummary,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
) -> BaseException | None:
    """Take one slot's outcome: count it, or leave its completion to the next statement, or
    record its failure. Returns the exception when it means the process is stopping."""
    job = outcome.job
    # Asked to stop (a timeout, a cancel, the process stopping) before it returned: it may
    # have returned early, so its end is the stop's, never a completion (issue 37).
    stopped = outcome.slot.stop_reason is not None and outcome.result in ("done", "error")
    ledger.finished(job, done=outcome.result == "done" and not stopped)
    if stopped:
        _record_stop(outcome, summary, reconnect, deadline=deadline)
    elif outcome.result == "completed":
        summary.completed += 1
    elif outcome.result == "lost":
        summary.lost += 1
        _log_lost(job, "its work was rolled back", "it committed its own steps")
    elif outcome.result == "error":
        assert outcome.error is not None
        _record_failure(outcome, summary, reconnect, stop=stop, deadline=deadline)
        if isinstance(outcome.error, PROCESS_STOPPING):
            return outcome.error
    return None


def _record_failure(
    outcome: Outcome,
    summary: RunSummary,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
) -> None:
    job, exc, started = outcome.job, outcome.error, outcome.slot.started
    assert exc is not None
    result = reconnecting(
        lambda: job_record_failure(
            job=job, worker=summary.worker, exc=exc, started_ago=time.monotonic() - started
        ),
        reconnect,
        stop=None if isinstance(exc, PROCESS_STOPPING) else stop,
        deadline=deadline,
    )
    if result is None:  # the database stayed away: the reaper takes the row after its lease
        result = "lost"
    setattr(summary, result, getattr(summary, result) + 1)
    if result == "snoozed":
        _log_snoozed(job, exc)
        return
    message = exception_message(exc)
    if isinstance(exc, Snooze):  # failed: its snoozes were spent (JOBS_MAX_SNOOZES)
        message = spent_reason(get_config().max_snoozes)
    summary.errors.append(
        redact_emails(f"#{job.id} {job.kind}: {type(exc).__name__}: {message}")[:300]
    )
    log = logger.error if result == "failed" else logger.warning
    log(
        "job #%s %s attempt %s/%s %s: %s: %s",
        job.id,
        job.kind,
        job.attempts,
        job.max_attempts,
        result,
        type(exc).__name__,
        redact_emails(message),
        extra={
            "action": f"job_{result}",
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.attempts,
        },
    )


def _log_snoozed(job: ClaimedJob, snooze: BaseException) -> None:
    logger.info(
        "job #%s %s snoozed for %g s (no attempt spent)",
        job.id,
        job.kind,
        getattr(snooze, "seconds", 0.0),
        extra={"action": "job_snoozed", "job_id": job.id, "kind": job.kind},
    )


def _record_stop(
    outcome: Outcome, summary: RunSummary, reconnect: Reconnect, *, deadline: float | None
) -> None:
    """The attempt of a handler asked to stop, now that it has returned: cancelled, or
    retried / failed with "timed out after N s", or queued again at once with its attempt
    given back (its process stops)."""
    slot, job = outcome.slot, outcome.job
    reason = slot.stop_reason
    assert reason is not None
    result = reconnecting(
        lambda: job_record_stopped(
            job=job,
            worker=summary.worker,
            reason=reason,
            seconds=slot.timeout,
            started_ago=time.monotonic() - slot.started,
            cause=outcome.error,
        ),
        reconnect,
        stop=None,  # recorded even while the process stops
        deadline=deadline,
    )
    if result is None:  # the database stayed away: the reaper takes the row after its lease
        result = "lost"
    setattr(summary, result, getattr(summary, result) + 1)
    if result != "lost" and reason == STOP_TIMEOUT:
        summary.timed_out += 1
    log = logger.error if result == "failed" else logger.warning
    log(
        "job #%s %s attempt %s/%s %s after it was asked to stop (%s)",
        job.id,
        job.kind,
        job.attempts,
        job.max_attempts,
        result,
        f"timed out after {slot.timeout:g} s" if reason == STOP_TIMEOUT else reason,
        extra={
            "action": "job_cancelled" if result == "cancelled" else f"job_{result}",
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.attempts,
            "reason": STOP_CANCEL if result == "cancelled" else reason,
        },
    )


def settle(ledger: Ledger, summary: RunSummary) -> None:
    """At the drain's end: send the completions not sent yet and give back what was never
    started, in one statement; count what the keeper thread did."""
    done, unstarted = ledger.take_done(), ledger.take_unstarted()
    if done or unstarted:

        def send() -> Step:
            return job_runner_step(
                worker=summary.worker,
                done=ago(done),
                release=[job.id for job in unstarted],
                durable=bool(unstarted) or must_flush(done),
            )

        resent = False
        try:
            try:
                step = send()
            except DatabaseError as exc:
                # The drain's connection may have died on an earlier statement (the error
                # that ended the drain): once more on a fresh one, or completions the
                # handlers finished would be left to the reaper and run again (I21). Each
                # write is guarded, so a first send that committed changes nothing.
                if not connection_lost(exc) or connection.in_atomic_block:
                    raise
                connection.close()
                resent = True
                step = send()
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
            count_completions(done, step.completed, summary, ledger.unsure, resent=resent)
            ledger.released += step.released
        ledger.sent(done)
    for job, completed in ledger.settled:
        count_completion(job, completed, summary, unsure=job.id in ledger.unsure)
    summary.released = ledger.released


def count_completions(
    done: list[Done],
    completed: frozenset[int],
    summary: RunSummary,
    unsure: set[int],
    *,
    resent: bool = False,
) -> None:
    """Count the completions one statement sent: `completed` holds the ids it completed.
    `resent`: the statement was sent again after a lost answer; `unsure`, the ids sent in an
    earlier statement whose answer was lost (see count_completion)."""
    for job, _started in done:
        count_completion(job, job.id in completed, summary, unsure=resent or job.id in unsure)


def count_completion(
    job: ClaimedJob, completed: bool, summary: RunSummary, *, unsure: bool = False
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
    _log_lost(job, "it wrote nothing in its transaction", "it committed its own steps")


def _log_lost(job: ClaimedJob, atomic: str, outside: str) -> None:
    in_transaction = registry.runs_in_transaction(job.kind) and not registry.is_async(job.kind)
    logger.warning(
        "job #%s %s was reaped while running; %s",
        job.id,
        job.kind,
        atomic if in_transaction else f"{outside} (idempotent handler)",
        extra={
            "action": "job_lease_lost",
            "job_id": job.id,
            "kind": job.kind,
            "attempt": job.attempts,
        },
    )
