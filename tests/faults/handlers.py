"""Job handlers of the runner's fault scenario (tests/faults/jobs_scenario.py).

Each appends `start N PID TIME` when it starts and `effect N PID TIME` for its external
effect to the file named in its payload (O_APPEND, one write per line; TIME is
`time.time()`), so the check can count how often each job ran and how often its effect
happened, whichever process ran it, and what ran before a crash of the server.
"""

from __future__ import annotations

import os
import time
import uuid

from django.contrib.auth import get_user_model
from django.db import transaction

from jobs import handler


def note(path: str, what: str, n: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {n} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def _row(n: int) -> None:
    get_user_model().objects.create(username=f"job{n}-{uuid.uuid4().hex[:12]}", last_name=str(n))


@handler("faults.record")
def record(payload: dict) -> None:
    """A database effect only, in the job's transaction (it commits with the completion)."""
    note(payload["log"], "start", payload["n"])
    if payload.get("sleep"):
        # `until`: end early when that file appears (the harness makes it when its fault
        # cuts a connection), to end exactly while the keeper's failed statement is retried.
        deadline = time.monotonic() + payload["sleep"]
        until = payload.get("until")
        while time.monotonic() < deadline and not (until and os.path.exists(until)):
            time.sleep(0.002)
    _row(payload["n"])


@handler("faults.charge")
def charge(payload: dict) -> None:
    """A non-idempotent external effect (a payment, a mail) and nothing in the database."""
    note(payload["log"], "start", payload["n"])
    note(payload["log"], "effect", payload["n"])


@handler("faults.own_steps", atomic=False)
def own_steps(payload: dict) -> None:
    """claim -> commit -> external effect: its own committed step, then the effect."""
    note(payload["log"], "start", payload["n"])
    with transaction.atomic():  # idempotent per attempt, as the registry asks of it
        get_user_model().objects.get_or_create(
            username=f"job{payload['n']}", defaults={"last_name": str(payload["n"])}
        )
    note(payload["log"], "effect", payload["n"])


@handler("faults.fail")
def fail(payload: dict) -> None:
    note(payload["log"], "start", payload["n"])
    raise RuntimeError("the partner API said no")


@handler("faults.capped", concurrency=1)
def capped(payload: dict) -> None:
    """A kind capped to one at a time for the whole deployment (issue 37, point 2)."""
    note(payload["log"], "start", payload["n"])
    note(payload["log"], "end", payload["n"])


@handler("faults.rated", rate="4/s")
def rated(payload: dict) -> None:
    """A kind limited to 4 starts a second for the whole deployment (issue 38, point 3):
    `start N PID TIME` (this host's wall clock), so the check counts the starts a second."""
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"start {payload['n']} {os.getpid()} {time.time()}\n".encode())
    finally:
        os.close(fd)


def _snoozes(job_id: int) -> int:
    from jobs.models import Job

    return Job.objects.filter(pk=job_id).values_list("snoozes", flat=True).get()


@handler("faults.snooze")
def snooze(payload: dict, job) -> None:
    """Issue 38, point 2: writes its row in the job's transaction, then snoozes (0 s) while
    the job has not snoozed yet: the row is rolled back with the snooze, and written by the
    run after it."""
    from jobs import Snooze

    note(payload["log"], "start", payload["n"])
    _row(payload["n"])
    if _snoozes(job.id) < 1:
        note(payload["log"], "snooze", payload["n"])
        raise Snooze(0)


@handler("faults.snooze_own_steps", atomic=False)
def snooze_own_steps(payload: dict, job) -> None:
    """As `faults.snooze`, committing its own step first (idempotent per attempt)."""
    from jobs import Snooze

    note(payload["log"], "start", payload["n"])
    with transaction.atomic():
        get_user_model().objects.get_or_create(
            username=f"job{payload['n']}", defaults={"last_name": str(payload["n"])}
        )
    if _snoozes(job.id) < 1:
        note(payload["log"], "snooze", payload["n"])
        raise Snooze(0)
