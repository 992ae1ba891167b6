"""The counter rollup every few seconds in each qcluster's main process (issue 32, point 3).

The statement triggers append a delta row per statement (ops/rollups.py), and every reader
(the health page, `worker_status`, `/metrics`, the runner's slow-kind read) sums the deltas
not rolled up yet on top of the rolled-up rows, so its figures are exact. At 1,000 jobs/s a
minute of deltas is ~144,000 count, 63,000 metric and 42,000 period rows; summing them (the
histograms element by element) cost the health page 430–650 ms and /metrics 700 ms at
1,000,000 jobs (bench/console.py), against a promise of 300 ms. django-q2 schedules no more
often than once a minute, so the qcluster command also rolls up on a thread every
OPS_ROLLUP_SECONDS (5): the readers then sum at most a few seconds of deltas. The minute
schedule ("ops: roll up counters") stays, for a cluster started without this command.

Two clusters' tickers (and the schedule) take turns on each rollup function's advisory lock;
a failed rollup moves nothing (one transaction per table family), and the next tick tries
again. Through an outage the thread writes one line, then a count every 30 s (QuietLog).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

from ops.conf import get_config
from ops.rollups import counters_roll_up
from project.quiet_log import QuietLog

logger = logging.getLogger(__name__)

THREAD_NAME = "counter-rollup"


class RollupTicker:
    """A daemon thread calling `counters_roll_up()` every `interval` seconds until stopped."""

    def __init__(self, *, interval: float | None = None) -> None:
        self.interval = interval if interval is not None else get_config().rollup_seconds
        if self.interval <= 0:
            raise ValueError(f"rollup interval {self.interval!r} must be above 0 seconds")
        self.rollups = 0  # that moved at least one delta
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._quiet = QuietLog(logger, "counter rollup")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread; wait a little for a rollup under way (one transaction: one cut
        short by the process's exit moves nothing, and the next rollup moves it all)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stopping.wait(self.interval):
                try:
                    moved = counters_roll_up(log_level=logging.DEBUG)
                except Exception as exc:  # noqa: BLE001 - the ticker's one catch-all: log, try next tick
                    self._quiet.failed(
                        exc,
                        "counter rollup: could not fold the counter deltas",
                        then=f"; trying again in {self.interval:g} s",
                        extra={"action": "counters_rollup_failed"},
                    )
                    connections.close_all()  # this thread's; a broken one is opened anew
                    continue
                self._quiet.recovered()
                self.rollups += bool(moved)
        finally:
            connections.close_all()


@contextmanager
def rollup_ticker_running(*, interval: float | None = None) -> Iterator[RollupTicker]:
    """Roll up the counters every `interval` (OPS_ROLLUP_SECONDS) seconds inside the block."""
    ticker = RollupTicker(interval=interval)
    ticker.start()
    try:
        yield ticker
    finally:
        ticker.stop()
