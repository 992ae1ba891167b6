"""Job handlers used by the tests. Subprocesses load them through
JOBS_EXTRA_HANDLER_MODULES=tests.jobs.handlers (see `worker_env` in conftest)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from django.contrib.auth import get_user_model

from jobs import handler
from jobs.exceptions import InvalidPayload, PermanentJobError


def _append(path: str, line: str) -> None:
    # O_APPEND with one small write per line: lines from several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@handler("tests.noop", idempotent=True)
def noop(payload: dict) -> None:
    pass


@handler("tests.log")
def log_execution(payload: dict) -> None:
    """Append `n pid` to payload['log'] on every execution, committed or not."""
    _append(payload["log"], f"{payload['n']} {os.getpid()}")
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("until"):  # run until the test has seen what it waits for (at most 60 s)
        deadline = time.monotonic() + 60
        while not os.path.exists(payload["until"]) and time.monotonic() < deadline:
            time.sleep(0.05)


@handler("tests.stamp_start")
def stamp_start(payload: dict) -> None:
    """Append `n wall-clock-start` to payload['log'] when the handler starts; then sleep."""
    _append(payload["log"], f"{payload['n']} {time.time()}")
    if payload.get("sleep"):
        time.sleep(payload["sleep"])


@handler("tests.create_user")
def create_user(payload: dict) -> None:
    get_user_model().objects.create(username=payload["username"])


@handler("tests.integrity_error")
def integrity_error(payload: dict) -> None:
    """COR-17: the handler's failure is a database error inside its transaction."""
    user_model = get_user_model()
    user_model.objects.create(username=payload["username"])
    user_model.objects.create(username=payload["username"])  # unique violation


@handler("tests.boom")
def boom(payload: dict) -> None:
    raise RuntimeError(payload.get("message", "boom"))


@handler("tests.permanent")
def permanent(payload: dict) -> None:
    raise PermanentJobError("this can never work")


@handler("tests.needs_user_id")
def needs_user_id(payload: dict) -> None:
    if not isinstance(payload.get("user_id"), int):
        raise InvalidPayload(f"user_id must be an integer, got {payload.get('user_id')!r}")


@handler("tests.interrupt")
def interrupt(payload: dict) -> None:
    get_user_model().objects.create(username=payload["username"])
    raise KeyboardInterrupt


@handler("tests.blocking")
def blocking(payload: dict) -> None:
    """Says it started, then waits while payload['block'] exists (killed there by a test)."""
    _append(payload["log"], f"start {os.getpid()}")
    deadline = time.monotonic() + 60
    while Path(payload["block"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    get_user_model().objects.create(username=f"done-{payload['n']}")
    _append(payload["log"], f"done {os.getpid()}")


@handler("tests.reaped_midway")
def reaped_midway(payload: dict) -> None:
    """Another process's reaper takes the row while this handler runs (a stalled worker)."""
    from django.db import connection

    from jobs.reaper import jobs_reap_stale

    get_user_model().objects.create(username=payload["username"])

    def reap() -> None:
        try:
            jobs_reap_stale(older_than=-5)
        finally:
            connection.close()

    thread = threading.Thread(target=reap)
    thread.start()
    thread.join(timeout=30)


@handler("tests.scripted")
def scripted(payload: dict) -> None:
    """Outcome chosen by the test: ok, error, db_error, permanent or invalid."""
    outcome = payload["outcome"]
    get_user_model().objects.create(username=f"s-{payload['n']}-{time.monotonic_ns()}")
    if outcome == "error":
        raise ValueError("scripted failure")
    if outcome == "db_error":
        get_user_model().objects.create(username=f"dup-{payload['n']}")
        get_user_model().objects.create(username=f"dup-{payload['n']}")
    if outcome == "permanent":
        raise PermanentJobError("scripted permanent failure")
    if outcome == "invalid":
        raise InvalidPayload("scripted rejection")


@handler("tests.commits_then_fails", atomic=False)
def commits_then_fails(payload: dict) -> None:
    """A handler that manages its own transactions (claim -> commit -> external call ->
    record): its committed step stands although it raises afterwards."""
    from django.db import connection, transaction

    outer = connection.in_atomic_block  # False: no transaction around the handler
    with transaction.atomic():
        get_user_model().objects.create(username=payload["username"], last_name=str(outer))
    raise RuntimeError("the external call failed after the claim committed")


class HandlerAbort(BaseException):  # noqa: N818 - named as a handler author might
    """A custom BaseException subclass, as a library might raise to unwind."""


@handler("tests.base_exception")
def base_exception(payload: dict) -> None:
    """Writes, then raises the BaseException named in the payload (not an Exception)."""
    import asyncio

    get_user_model().objects.create(username=payload["username"])
    raise {
        "CancelledError": asyncio.CancelledError("cancelled by the handler"),
        "GeneratorExit": GeneratorExit("generator closed"),
        "HandlerAbort": HandlerAbort("custom abort"),
        "SystemExit": SystemExit(3),
    }[payload["raise"]]


@handler("tests.lose_connection_after_commit")
def lose_connection_after_commit(payload: dict) -> None:
    """Completes, then has another connection terminate this one (as an operator's
    pg_terminate_backend or a server restart would) right after the commit: the runner's
    next statement, the next claim, meets a dead connection."""
    from django.db import connection, transaction

    pid = connection.connection.info.backend_pid

    def terminate() -> None:
        def run() -> None:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(timeout=30)

    get_user_model().objects.create(username=payload["username"])
    transaction.on_commit(terminate)


@handler("tests.nul_in_error")
def nul_in_error(payload: dict) -> None:
    """Hostile input quoted in an error: PostgreSQL text cannot hold a NUL character."""
    raise ValueError("unexpected byte \x00 in the input")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot describe itself")


@handler("tests.unprintable_error")
def unprintable_error(payload: dict) -> None:
    raise UnprintableError()


# --- issue 37: slots, `async def` handlers, the job context ---------------------------------


@handler("tests.async_log")
async def async_log(payload: dict) -> None:
    """Awaits, then appends `n wall-clock-time` to payload['log']: a body the runner never
    awaited writes nothing."""
    import asyncio

    await asyncio.sleep(payload.get("sleep", 0.05))
    _append(payload["log"], f"{payload['n']} {time.time()}")


@handler("tests.async_boom")
async def async_boom(payload: dict) -> None:
    import asyncio

    await asyncio.sleep(0.01)
    raise ValueError(f"async handler failed after its await ({payload.get('n')})")


class AsyncPeak:
    """How many `tests.async_peak` handlers were awaiting at once (one event loop: no lock)."""

    running = 0
    peak = 0


@handler("tests.async_peak", idempotent=True)
async def async_peak(payload: dict) -> None:
    import asyncio

    AsyncPeak.running += 1
    AsyncPeak.peak = max(AsyncPeak.peak, AsyncPeak.running)
    try:
        await asyncio.sleep(payload["sleep"])
    finally:
        AsyncPeak.running -= 1


_rendezvous_lock = threading.Lock()
_rendezvous: dict[str, threading.Barrier] = {}


@handler("tests.rendezvous")
def rendezvous(payload: dict) -> None:
    """Waits until payload['parties'] handlers of the same payload['name'] wait here (in
    this process's slots), then all return at the same moment (60 s at most)."""
    with _rendezvous_lock:
        barrier = _rendezvous.setdefault(
            payload["name"], threading.Barrier(payload["parties"], timeout=60)
        )
    barrier.wait()


@handler("tests.with_context")
def with_context(payload: dict, job) -> None:
    """Writes what its job context says, as JSON, to payload['log']."""
    import json

    _append(
        payload["log"],
        json.dumps(
            {
                "id": job.id,
                "kind": job.kind,
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "enqueued_at": job.enqueued_at.isoformat(),
                "started_at": job.started_at.isoformat(),
                "deadline": job.deadline.isoformat() if job.deadline else None,
                "stop_requested": job.stop_requested.is_set(),
                "thread": threading.current_thread().name,
            }
        ),
    )


@handler("tests.async_with_context")
async def async_with_context(payload: dict, job) -> None:
    _append(payload["log"], f"{job.id} {job.kind} {job.attempt} {job.stop_requested.is_set()}")


# Issue 37, point 2: kinds with a cap for the whole deployment. A qcluster started by a test
# writes these caps at start-up (jobs/kind_caps.py).
CAPPED_KIND = "tests.capped"
CAPPED_CONCURRENCY = 2
CAPPED_ONE_KIND = "tests.capped_one"


@handler(CAPPED_KIND, concurrency=CAPPED_CONCURRENCY)
def capped(payload: dict) -> None:
    """Append `start n t` and `end n t` (this host's wall clock) around a sleep: the test
    reads how many ran at once."""
    _append(payload["log"], f"start {payload['n']} {time.time()}")
    time.sleep(payload.get("sleep", 0))
    _append(payload["log"], f"end {payload['n']} {time.time()}")


@handler(CAPPED_ONE_KIND, concurrency=1)
def capped_one(payload: dict) -> None:
    time.sleep(payload.get("sleep", 0))


# Issue 38, point 3: kinds with a rate for the whole deployment. A qcluster started by a test
# writes these rates at start-up (jobs/kind_rates.py).
RATED_KIND = "tests.rated"
RATED_RATE = "5/s"
RATED_HOURLY_KIND = "tests.rated_hourly"


@handler(RATED_KIND, rate=RATED_RATE)
def rated(payload: dict) -> None:
    """Append `start n t` (this host's wall clock) when given a log: the test reads how many
    started in any one-second window."""
    if "log" in payload:
        _append(payload["log"], f"start {payload['n']} {time.time()}")


@handler(RATED_HOURLY_KIND, rate="1/h")
def rated_hourly(payload: dict) -> None:
    pass


# Issue 38, point 2: handlers that snooze. Each appends `start n t` (this host's wall clock)
# to payload['log'] and writes a user row in its transaction (rolled back when it snoozes),
# then snoozes payload['seconds'] while it has started at most payload['times'] times (the
# log's lines say how often); with payload['raw'] it raises Snooze(raw) as given (hostile
# values: "nan", "inf" and "ten years" stand for what JSON cannot carry).
RAW_SNOOZES = {"nan": float("nan"), "inf": float("inf"), "ten years": 10 * 365 * 86400}


def _snooze_or_not(payload: dict) -> None:
    from jobs import Snooze

    _append(payload["log"], f"start {payload.get('n', 0)} {time.time()}")
    get_user_model().objects.create(username=f"snoozer-{time.monotonic_ns()}")
    if "raw" in payload:
        raise Snooze(RAW_SNOOZES.get(payload["raw"], payload["raw"]))
    starts = len(Path(payload["log"]).read_text().splitlines())
    if starts <= payload.get("times", 1):
        raise Snooze(payload.get("seconds", 0))


@handler("tests.snooze")
def snooze(payload: dict) -> None:
    _snooze_or_not(payload)


@handler("tests.snooze_own_steps", atomic=False)
def snooze_own_steps(payload: dict) -> None:
    _snooze_or_not(payload)


@handler("tests.snooze_async")
async def snooze_async(payload: dict) -> None:
    import asyncio

    await asyncio.to_thread(_snooze_in_thread, payload)


def _snooze_in_thread(payload: dict) -> None:
    from django.db import connection

    try:
        _snooze_or_not(payload)
    finally:
        connection.close()


@handler("tests.until_marked_started", atomic=False)
def until_marked_started(payload: dict, job) -> None:
    """Waits at a barrier of payload['parties'] (all running in this process's slots), then
    until its own row shows its start (the keeper's mark of a job running longer than
    JOBS_HOLD_UNSTARTED_SECONDS), 60 s at most; raises if the mark never comes."""
    from jobs.models import Job

    rendezvous(payload)
    deadline = time.monotonic() + 60
    while not Job.objects.filter(pk=job.id, started_at__isnull=False).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job.id} never marked started")
        time.sleep(0.02)
