"""Handlers of the timeout, cancel and stop tests (issue 37, points 6 to 9). In this process
they meet the test through `GATES` (threading.Events by name, for forced interleavings);
in a `run_jobs` child (JOBS_EXTRA_HANDLER_MODULES=tests.jobs.stop_handlers) through files
named in the payload."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import defaultdict

from jobs import handler

GATES: defaultdict[str, threading.Event] = defaultdict(threading.Event)
SEEN: dict[str, object] = {}  # what a handler saw, by the payload's name


def _touch(path: str | None, text: str = "") -> None:
    if path:
        with open(path, "a") as out:
            out.write(text + "\n")


@handler("tests.stop.async_sleeps", atomic=False, timeout=0.5)
async def async_sleeps(payload: dict, job) -> None:
    """Awaits far past its timeout: the runner cancels the task."""
    SEEN[payload["name"] + ".deadline"] = job.deadline
    GATES[payload["name"] + ".started"].set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        SEEN[payload["name"] + ".cancelled"] = True
        raise


@handler("tests.stop.thread_polite", atomic=False, timeout=0.5)
def thread_polite(payload: dict, job) -> None:
    """Checks `job.stop_requested` and returns when asked (a cooperative long handler)."""
    SEEN[payload["name"] + ".deadline"] = job.deadline
    SEEN[payload["name"] + ".started_at"] = job.started_at
    GATES[payload["name"] + ".started"].set()
    SEEN[payload["name"] + ".asked"] = job.stop_requested.wait(30)
    GATES[payload["name"] + ".hold"].wait(30)  # the test may hold it after the request


@handler("tests.stop.quick", atomic=False)
def quick(payload: dict) -> None:
    GATES[payload.get("name", "quick") + ".ran"].set()
    _touch(payload.get("log"), f"quick {payload.get('n')}")


@handler("tests.stop.gated", atomic=False)
def gated(payload: dict) -> None:
    """Runs until the test opens its gate (the default timeout applies)."""
    GATES[payload["name"] + ".started"].set()
    GATES[payload["name"] + ".release"].wait(30)


@handler("tests.stop.atomic_polite", timeout=30)
def atomic_polite(payload: dict, job) -> None:
    """Writes in its transaction, then waits to be asked to stop: its writes roll back."""
    from django.contrib.auth import get_user_model

    get_user_model().objects.create(username=payload["username"])
    GATES[payload["name"] + ".started"].set()
    job.stop_requested.wait(30)


@handler("tests.stop.async_polite", atomic=False, timeout=30)
async def async_polite(payload: dict, job) -> None:
    GATES[payload["name"] + ".started"].set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        SEEN[payload["name"] + ".cancelled"] = True
        raise


@handler("tests.stop.async_swallows", atomic=False, timeout=0.3)
async def async_swallows(payload: dict) -> None:
    """Swallows every cancellation and goes on awaiting, until the test lets it go."""
    GATES[payload["name"] + ".started"].set()
    swallowed = 0
    while not GATES[payload["name"] + ".release"].is_set():
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            swallowed += 1
            SEEN[payload["name"] + ".swallowed"] = swallowed


@handler("tests.stop.async_blocks_loop", atomic=False, timeout=0.3)
async def async_blocks_loop(payload: dict) -> None:
    """Blocks the event loop (a synchronous call in an async def) past its timeout."""
    GATES[payload["name"] + ".started"].set()
    GATES[payload["name"] + ".release"].wait(30)  # blocking: no await
    await asyncio.sleep(0)


@handler("tests.stop.async_other", atomic=False)
async def async_other(payload: dict) -> None:
    """An unrelated async job: awaits a little and completes."""
    await asyncio.sleep(payload.get("sleep", 0.05))
    GATES[payload["name"] + ".ran"].set()


@handler("tests.stop.never_returns", atomic=False, timeout=0.5)
def never_returns(payload: dict, job) -> None:
    """Ignores the request to stop (a blocking call with no timeout): its process retires."""
    _touch(payload.get("started"), str(os.getpid()))
    name = payload.get("name", "never")
    GATES[name + ".started"].set()
    deadline = time.monotonic() + payload.get("seconds", 120)
    while time.monotonic() < deadline and not GATES[name + ".release"].is_set():
        time.sleep(0.05)


@handler("tests.stop.slow_polite", atomic=False, timeout=60)
def slow_polite(payload: dict, job) -> None:
    """Works `seconds` in steps, stopping early when asked (a deploy's stop); logs how it ended."""
    _touch(payload.get("started"), str(payload["n"]))
    deadline = time.monotonic() + payload.get("seconds", 30)
    while time.monotonic() < deadline:
        if job.stop_requested.wait(0.05):
            _touch(payload.get("log"), f"stopped {payload['n']}")
            return
    _touch(payload.get("log"), f"finished {payload['n']}")


@handler("tests.stop.thread_waits", atomic=False, timeout=30)
def thread_waits(payload: dict, job) -> None:
    """Waits to be asked to stop (a cancel), then returns as a polite handler does."""
    GATES[payload["name"] + ".started"].set()
    SEEN[payload["name"] + ".asked"] = job.stop_requested.wait(30)
    SEEN[payload["name"] + ".reason"] = job.stop_reason
    GATES[payload["name"] + ".hold"].wait(30)


@handler("tests.stop.never_returns_long", atomic=False, timeout=60)
def never_returns_long(payload: dict) -> None:
    """Ignores every request to stop, with a timeout longer than the test: a deploy's stop."""
    _touch(payload.get("started"), str(os.getpid()))
    time.sleep(120)
