"""The job loop: claim what the slots can start, run the handlers, record the outcomes.

Three parts, as River keeps them (issue 37, docs/architecture.md): the producer
(`jobs.producer`: the drain's one statement, which also carries the completions), the
executor (`jobs.slots`: thread slots and an event loop; it knows nothing of the runner's
SQL) and the completer (`jobs.completer`); the ledger (`jobs.ledger`) is what they share,
the keeper thread (`jobs.keeper`) renews its leases. This module sets a drain up and tears
it down; the drain's loop (`jobs.drain`) owns the drain's connection, and is the one place
that decides when to send.

The loop holds no state the database does not have: a crash at any point leaves rows
`processing` with a lease that the heartbeat stops renewing, and the reaper takes it from
there (I4). A handler's transaction is rolled back *before* its failure is recorded, and the
failure is written in a transaction of its own (I3, COR-17).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection

from jobs import registry
from jobs.completer import RunSummary, settle
from jobs.conf import get_config
from jobs.drain import Drain
from jobs.keeper import Keeper
from jobs.ledger import Ledger
from jobs.runner_step import new_worker_id
from jobs.slots import Executor
from jobs.stopping import Supervisor, give_up_hung, retire_inline
from processes.beacon import doing

__all__ = ["RunSummary", "run_pending"]

logger = logging.getLogger(__name__)


def run_pending(
    limit: int | None = None,
    *,
    max_seconds: float | None = None,
    stop: threading.Event | None = None,
    wake_others: Callable[[], object] | None = None,
    linger: float = 0.0,
) -> RunSummary:
    """Drain due jobs in this process until none is due, `limit` jobs ran, or `max_seconds`
    passed (checked before each job starts: a job is never started after it); return what
    happened. Reaching `max_seconds` or setting `stop` (e.g. from a SIGTERM handler) ends
    the drain once its running jobs have ended; unstarted claims are released, their
    attempt undone.

    With JOBS_CONCURRENCY above 1 the handlers run in that many thread slots, and `async
    def` handlers on an event loop (JOBS_ASYNC_CONCURRENCY); a claim takes what the free
    slots can start, so nothing waits behind a slow job. With one slot, or inside a
    caller's transaction (a test's: its claims are seen by no other connection), each job
    runs on this thread, one after another, from batches of JOBS_CLAIM_BATCH_SIZE; the
    keeper thread gives the rest of a batch back when one runs longer than
    JOBS_HOLD_UNSTARTED_SECONDS (issue 22, point 4).

    One statement completes the jobs run since the last one and claims the next ones
    (issue 22, point 5); a completion that must be flushed (a kind not declared
    idempotent) is sent before its slot starts another job (I21), together with every
    other slot's that ended meanwhile. When a claim sees more due jobs than it took,
    `wake_others` is called (once per drain; the qcluster task sends a wake task). With
    `linger` (seconds) a drain that finds nothing due waits that long for a job, asking
    every JOBS_LINGER_POLL_SECONDS (issue 29, point 5).

    Call it outside any transaction (its claims must commit before handlers run).
    """
    registry.discover()
    config = get_config()
    inside = connection.in_atomic_block
    inline = inside or config.concurrency == 1
    summary = RunSummary(worker=new_worker_id())
    if not inline:
        registry.check_reservations(
            threads=config.concurrency, async_tasks=config.async_concurrency
        )
    ledger = Ledger(
        threads=1 if inline else config.concurrency,
        async_tasks=1 if inline else config.async_concurrency,
        reserved={} if inline else registry.reserved_slots(),
    )
    executor = Executor(
        worker=summary.worker,
        threads=config.concurrency,
        inline=inline,
        atomic_units=config.atomic_concurrency,
    )
    drain = Drain(
        summary, ledger, executor, limit=limit, max_seconds=max_seconds, stop=stop,
        wake_others=wake_others, linger=linger,
    )  # fmt: skip
    # Timeouts, cancel requests, the process stopping, hung handlers (issue 37, points 6, 8
    # and 9), ticked by the keeper: in the one-slot drain this thread runs the handler itself.
    supervisor = Supervisor(executor, worker=summary.worker, config=config, stop=stop)
    if inline and not inside:
        supervisor.on_hung = lambda: retire_inline(executor, ledger, summary.worker, config)
    keeper = Keeper(
        summary.worker, ledger, hand_back=not inside, send_done=inline, supervise=supervisor.tick
    )
    keeper.start()
    stopping: BaseException | None = None
    try:
        stopping = drain.run_inline() if inline else drain.run_slots()
    finally:
        try:
            drain.let_slots_end()
        finally:
            doing("")  # issue 20 hook: idle again in the process registry
            keeper.stop()  # no statement of its own from here on
            give_up_hung(executor, summary, config, drain.record_all)
            settle(ledger, summary)
            drain.report_slots()  # none in use now
            executor.shutdown()
            summary.seconds = time.monotonic() - drain.started
    if stopping is not None:
        raise stopping  # recorded; now let the process stop
    if summary.claimed:
        logger.info(
            "jobs drained: %s",
            summary,
            extra={"action": "jobs_drained", **summary.as_dict()},
        )
    return summary
