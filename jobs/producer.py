"""The producer (issue 37): the drain's one statement, which sends the completer's
completions and claims what the free slots can start (jobs_runner_step_v5: one round trip
and one commit for both), and the waits around it: the gather before a claim, the linger
for the next due job. Everything here runs on the drain thread and its connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError
from django.utils import timezone

from jobs import linger_signal, selectors
from jobs.claim_floor import claim_floor
from jobs.conf import get_config
from jobs.keeper import ago
from jobs.ledger import Done, Room, must_flush
from jobs.runner_step import Step, job_runner_step
from jobs.slow_kinds import slow_kinds
from project.reconnect import Reconnect, connection_lost, sleep_until

T = TypeVar("T")


def send_step(
    worker: str,
    reconnect: Reconnect,
    *,
    stop: threading.Event | None,
    deadline: float | None,
    done: list[Done],
    claim: int,
    want_more: bool,
    slow: bool = True,
    room: Callable[[], Room] | None = None,
    beyond: int = 0,
) -> tuple[Step | None, bool]:
    """The drain's statement (completions, then a claim), sent again after a lost
    connection; returns the step (None if the connection stayed lost) and whether it was
    sent more than once (an earlier try may have committed with its answer lost).
    `slow`: end the claim with the kinds known to run long (the one-slot drain, whose claims
    wait behind each other); `room`: the drain's free slots,
    read as the statement goes (the claim takes no more of a kind than they can start);
    `beyond`: how many past the free thread slots a kind nothing limits may take (not a kind
    known to run long: the slow kinds are read for it too)."""
    tries = 0

    def send() -> Step:
        nonlocal tries
        tries += 1
        # Issue 32, point 1: the scan starts at this process's floor (a full scan every
        # JOBS_CLAIM_FULL_SCAN_SECONDS, less often while full scans are slow), so an old
        # snapshot's dead entries below it cost no heap visit.
        floor = claim_floor.bound() if claim else None
        linger_signal.looking()  # the listener's sign that a drain runs (issue 37, point 1)
        late = claim and (slow or beyond > 0)
        ends = slow_kinds.get(get_config().hold_unstarted_seconds) if late else []
        space = room() if claim and room is not None else None
        sent = time.monotonic()  # the statement's time, not the slow-kind read's
        step = job_runner_step(
            worker=worker,
            done=ago(done),
            claim=claim,
            want_more=want_more,
            durable=must_flush(done),
            slow_kinds=ends,
            floor=floor,
            room=space,
            beyond=beyond if space is not None else 0,
        )
        if space is None or scanned_every_lane(space):
            claim_floor.saw(bound=floor, seen=step.seen_floor, took=time.monotonic() - sent)
        return step

    step = reconnecting(send, reconnect, stop=stop, deadline=deadline)
    return step, tries > 1


def scanned_every_lane(room: Room) -> bool:
    """Whether a claim with this room scanned every lane that may run. A kind of slot with
    none free makes its kinds' lanes take 0 rows (a reserved kind's own free slots aside),
    so what the claim "saw" says nothing of their rows: taken as the floor, the database's
    clock at that scan hid every job queued before it from the next claims until a full
    scan (a burst drain ended with jobs queued; tests/jobs/test_claim_floor_room.py). No
    event-loop slot free matters only where a kind runs on the event loop."""
    return room.thread_free > 0 and (room.async_free > 0 or not room.async_kinds)


def reconnecting(
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


def due_now() -> bool:
    """One read of the claim index (from this process's floor): is a job due?"""
    return _due_read().due_run_after is not None


def due_within(
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
        linger_signal.wait(wait)  # the listener's nudge ends it early
        if stop is not None and stop.is_set():
            return False
        seen = _due_read()
        if seen.due_run_after is not None:
            return True
        if seen.task_waiting:
            return False


def _due_read() -> selectors.LingerPoll:
    linger_signal.looking()
    floor = claim_floor.bound()  # as the claim's scan (issue 32, point 1)
    sent = time.monotonic()
    seen = selectors.job_due_or_task_waiting(now=timezone.now(), floor=floor)
    claim_floor.saw(
        bound=floor, seen=seen.due_run_after or seen.scanned_at, took=time.monotonic() - sent
    )
    return seen


def wait_until(until: float, *, stop: threading.Event | None, deadline: float | None) -> None:
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
