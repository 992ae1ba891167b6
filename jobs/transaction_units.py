"""The connection budget of a process's slots (issue 37, docs/operations.md): at most
JOBS_ATOMIC_CONCURRENCY slots inside an `atomic` handler's transaction at once. Apart from
the executor (jobs/slots.py) and a handler's run (jobs/handler_run.py), which takes a unit
through it, because it is a budget of its own: a count of server connections held, not of
slots.

An `atomic` handler's transaction holds a connection (behind PgBouncer, a server connection)
from its first statement to its commit, and a handler may wait inside it for something that
needs another connection (the canonical-id minter's lease did). So a slot takes a unit
(`TransactionUnits`) just before its transaction's first statement, while it holds no
server connection yet, and gives it back after the commit or rollback. A handler that
writes nothing takes none; `atomic=False` and `async def` handlers take none (their
completion is the drain's statement).
"""

from __future__ import annotations

import logging
import threading

UNIT_WAIT_LOG_SECONDS = 10.0  # a slot waiting this long for a transaction unit says so

logger = logging.getLogger(__name__)


class TransactionUnits:
    """The process's JOBS_ATOMIC_CONCURRENCY units: one per slot inside an `atomic`
    handler's transaction. `holding()` wraps such a transaction on the slot's connection and
    takes a unit just before its first statement (`connection.execute_wrapper`)."""

    def __init__(self, units: int) -> None:
        self.units = units
        self._free = threading.Semaphore(units)
        self._lock = threading.Lock()
        self.in_use = 0
        self.peak = 0

    def holding(self) -> _UnitHold:
        return _UnitHold(self)

    def take(self, kind: str) -> None:
        if not self._free.acquire(timeout=UNIT_WAIT_LOG_SECONDS):
            logger.warning(
                "a %s job has waited %s s for a transaction unit (JOBS_ATOMIC_CONCURRENCY=%s: "
                "that many atomic handlers of this process are inside their transaction)",
                kind,
                UNIT_WAIT_LOG_SECONDS,
                self.units,
                extra={"action": "job_waits_for_transaction_unit", "kind": kind},
            )
            self._free.acquire()
        with self._lock:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)

    def give_back(self) -> None:
        with self._lock:
            self.in_use -= 1
        self._free.release()


class _UnitHold:
    """A slot's hold on a unit for one transaction: taken at its first statement."""

    def __init__(self, units: TransactionUnits) -> None:
        self.units = units
        self.kind = ""
        self.taken = False

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001 - Django's wrapper
        if not self.taken:
            self.units.take(self.kind)
            self.taken = True
        return execute(sql, params, many, context)

    def release(self) -> None:
        if self.taken:
            self.taken = False
            self.units.give_back()
