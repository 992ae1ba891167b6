"""Job handlers of the slots scenario (tests/faults/slots_scenario.py; issue 37, point 5).

Each appends `start N PID SLOT TIME` when it starts and `effect N PID SLOT TIME` for its
effect to the file named in its payload (O_APPEND, one write per line): SLOT is the thread
(`jobs-slot-2`, or the drain's own thread) or `loop` for an `async def` handler, TIME is
`time.time()`, so the check can tell what ran before a crash of the server.

Slots started together end together: a handler waits until its process has started
`together` jobs (the size of its wave, from the payload; at most TOGETHER_SECONDS), then the
handlers whose completion is the drain's (`done`) return at once, their own writes made
before, so their completions reach the drain at once and share its next statement and
commit. The handlers that commit on their own at the end (an atomic handler's completion,
a failure's record) return LATE_SECONDS after the others (`late` in the payload), so that
no durable commit of another connection follows the drain's shared one by chance: a crash
right after it tells whether that commit itself was durable. Meanwhile the drain, waiting
for a slot, polls for due jobs (JOBS_LINGER_POLL_SECONDS): that round trip is faulted too.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from django.contrib.auth import get_user_model
from django.db import transaction

from jobs import handler

TOGETHER_SECONDS = 0.5  # a wave cut short by a fault (or another process's) waits no longer
LATE_SECONDS = 0.12  # more than JOBS_LINGER_POLL_SECONDS: the drain polls while they run


def note(path: str, what: str, n: int, slot: str | None = None) -> None:
    slot = slot or threading.current_thread().name
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {n} {os.getpid()} {slot} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def _started(payload: dict) -> bool:
    """Whether this process has started the jobs of this one's wave."""
    pid = f" {os.getpid()} "
    try:
        with open(payload["log"]) as log:
            starts = sum(1 for line in log if line.startswith("start ") and pid in line)
    except FileNotFoundError:
        return False
    return starts >= payload["together"]


def _together(payload: dict) -> None:
    deadline = time.monotonic() + TOGETHER_SECONDS
    while not _started(payload) and time.monotonic() < deadline:
        time.sleep(0.002)
    if payload.get("late"):
        time.sleep(LATE_SECONDS)


async def _together_async(payload: dict) -> None:
    deadline = time.monotonic() + TOGETHER_SECONDS
    while not _started(payload) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)


def _row(n: int) -> None:
    get_user_model().objects.get_or_create(username=f"slot{n}", defaults={"last_name": str(n)})


@handler("faults.slots.record")
def record(payload: dict) -> None:
    """A database effect only, in the job's transaction: it commits with the completion,
    in the slot (a plain `create`, so a second run would be a second row)."""
    note(payload["log"], "start", payload["n"])
    _together(payload)
    get_user_model().objects.create(
        username=f"slot{payload['n']}-{os.getpid()}-{time.monotonic_ns()}",
        last_name=str(payload["n"]),
    )


@handler("faults.slots.charge")
def charge(payload: dict) -> None:
    """A non-idempotent external effect and nothing in the database: its completion waits
    for the drain's next statement, which must commit it durably before the slot goes on."""
    note(payload["log"], "start", payload["n"])
    _together(payload)
    note(payload["log"], "effect", payload["n"])


@handler("faults.slots.own_steps", atomic=False)
def own_steps(payload: dict) -> None:
    """Its own committed step (idempotent per attempt), then an external effect."""
    note(payload["log"], "start", payload["n"])
    with transaction.atomic():
        _row(payload["n"])
    _together(payload)
    note(payload["log"], "effect", payload["n"])


@handler("faults.slots.touch", atomic=False, idempotent=True)
def touch(payload: dict) -> None:
    """Declared idempotent: running it twice is harmless (get_or_create), so its completion
    may be batched without the WAL flush."""
    note(payload["log"], "start", payload["n"])
    _row(payload["n"])
    _together(payload)


@handler("faults.slots.fail")
def fail(payload: dict) -> None:
    note(payload["log"], "start", payload["n"])
    _together(payload)
    raise RuntimeError("the partner API said no")


@handler("faults.slots.async_charge")
async def async_charge(payload: dict) -> None:
    """An `async def` handler with a non-idempotent external effect: its completion is the
    runner's, as an `atomic=False` handler's is, flushed."""
    note(payload["log"], "start", payload["n"], "loop")
    await _together_async(payload)
    note(payload["log"], "effect", payload["n"], "loop")


@handler("faults.slots.async_touch", idempotent=True)
async def async_touch(payload: dict) -> None:
    """An `async def` handler declared idempotent: its effect may happen twice."""
    note(payload["log"], "start", payload["n"], "loop")
    await _together_async(payload)
    note(payload["log"], "effect", payload["n"], "loop")
