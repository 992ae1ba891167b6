"""The beacon of one OS process: registers it, beats on a thread, says what it works on.

`beacon_running(role=…)` wraps a service loop (project.command_loop) and the qcluster's main
process; django-q2's worker processes start one on `post_spawn` and mark it stopped as they exit
(a multiprocessing finalizer); a killed one shows as gone after MISSED_BEATS intervals. The job
runner and the mail poller call `doing("job #12 report.render")` / `doing("")`, the job runner
`using_slots(...)` (its slots, in use per kind): a no-op in a process without a beacon
(tests, `--once` commands, the web).

The beat runs on its own thread, so a long job or a hung S3 call does not silence it: a
process goes silent only when it is gone (killed, host lost) or stuck so badly that the
interpreter no longer runs threads. A change of the current job wakes the thread, which
writes it at most once per CURRENT_WRITE_MIN_SECONDS.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError

from processes import services
from processes.conf import CURRENT_WRITE_MIN_SECONDS, get_config
from project.quiet_log import QuietLog

logger = logging.getLogger(__name__)


class Beacon:
    def __init__(self, *, role: str, interval: float | None = None) -> None:
        self.role = role
        self.interval = interval or get_config().heartbeat_seconds
        self.process_id: int | None = None
        self.current = ""
        self.slots: dict | None = None  # a job worker's slots (issue 37, point 10)
        self._changed = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Beats failing through an outage: one line, then a count per 30 s (I24).
        self._quiet = QuietLog(logger, f"process beat ({role})")

    def start(self) -> None:
        """Register now (so the row exists when this returns) and start beating. A database
        that is down now is not fatal: the thread registers once it answers."""
        try:
            self.process_id = services.process_register(role=self.role, interval=self.interval)
        except DatabaseError as exc:
            self._quiet.failed(
                exc,
                "process beat (%s): could not register this process",
                self.role,
                then="; retrying on the next beat",
                extra={"action": "process_register_failed", "role": self.role},
            )
        self._thread = threading.Thread(
            target=self._run, name=f"process-beacon-{self.role}", daemon=True
        )
        self._thread.start()

    def doing(self, what: str) -> None:
        if what != self.current:
            self.current = what
            self._changed.set()

    def using_slots(self, slots: dict) -> None:
        if slots != self.slots:
            self.slots = slots
            self._changed.set()

    def stop(self) -> None:
        """A clean stop: end the beat and mark the row stopped."""
        self._stopping.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.process_id is None:
            return
        try:
            services.process_stop(process_id=self.process_id)
        except DatabaseError:
            logger.warning(
                "could not mark process #%s stopped; it shows as gone after its beats stop",
                self.process_id,
                exc_info=True,
                extra={"action": "process_stop_failed", "process_id": self.process_id},
            )

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wait_for_beat()
            if self._stopping.is_set():
                return
            try:
                self._beat()
            except Exception as exc:  # noqa: BLE001 - the beat loop's one catch-all: log, beat again next interval
                self._quiet.failed(
                    exc,
                    "process beat (%s): beat of process #%s failed",
                    self.role,
                    self.process_id,
                    then="; trying again",
                    extra={"action": "process_beat_failed", "role": self.role},
                )
                continue
            self._quiet.recovered()

    def _beat(self) -> None:
        if self.process_id is None:
            self.process_id = services.process_register(role=self.role, interval=self.interval)
        if not services.process_beat(
            process_id=self.process_id, current=self.current, slots=self.slots
        ):
            logger.warning(
                "process row #%s vanished or was marked stopped; registering again",
                self.process_id,
                extra={"action": "process_reregistered", "process_id": self.process_id},
            )
            self.process_id = services.process_register(role=self.role, interval=self.interval)
            services.process_beat(
                process_id=self.process_id, current=self.current, slots=self.slots
            )

    def _wait_for_beat(self) -> None:
        """Until the next beat is due, or (at most once per CURRENT_WRITE_MIN_SECONDS) the
        current job or mail changed."""
        if self._changed.wait(self.interval) and not self._stopping.is_set():
            self._stopping.wait(min(CURRENT_WRITE_MIN_SECONDS, self.interval))
        self._changed.clear()


_beacon: Beacon | None = None


def doing(what: str) -> None:
    """Say what this process works on now ("" when idle); a no-op without a beacon."""
    beacon = _beacon
    if beacon is not None:
        beacon.doing(what)


def using_slots(*, threads: int, async_tasks: int, busy: dict[str, int]) -> None:
    """Say how many job slots this process has and how many each kind uses now (issue 37,
    point 10); written with the next beat (at most once per CURRENT_WRITE_MIN_SECONDS while
    it changes). A no-op without a beacon."""
    beacon = _beacon
    if beacon is not None:
        beacon.using_slots({"threads": threads, "async": async_tasks, "busy": dict(busy)})


@contextmanager
def beacon_running(*, role: str) -> Iterator[Beacon]:
    """Register this process for the block, beat while in it, mark it stopped after."""
    global _beacon
    beacon = Beacon(role=role)
    beacon.start()
    previous, _beacon = _beacon, beacon
    try:
        yield beacon
    finally:
        _beacon = previous
        beacon.stop()


def register_spawned_worker(sender: Any = None, proc_name: str = "", **kwargs: Any) -> None:
    """django-q2's post_spawn, in each new worker process: register it and beat until the
    sentinel ends it.

    django-q2 also sends it in the calling process when it runs a task synchronously
    (`sync=True`, Q_SYNC): that is a web or test process, not a qcluster worker, and each
    such task would start another beat thread that never stops."""
    global _beacon
    if multiprocessing.parent_process() is None:
        return
    beacon = Beacon(role="qcluster worker")
    beacon.start()
    _beacon = beacon
    # A worker ends its loop on the sentinel's STOP and returns: multiprocessing then runs
    # the finalizers with an exit priority (never atexit), so the row is marked stopped and
    # leaves the live list at once (issue 31.4), not after MISSED_BEATS silent beats. A
    # worker killed (timeout, SIGKILL) still shows as gone after those beats.
    multiprocessing.util.Finalize(beacon, beacon.stop, exitpriority=10)


def forget_after_fork() -> None:
    """The child of a fork has no beat thread, and the row is the parent's."""
    global _beacon
    _beacon = None
