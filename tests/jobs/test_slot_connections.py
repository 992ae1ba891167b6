"""Connections the server ended while a drain with slots runs (a restart, a failover,
`pg_terminate_backend`; issue 37, point 5): a slot thread's connection ended between two jobs
is not the next job's failure, and the drain's connection ended while it waits for a slot
loses no completion.

Found by the fault harness's crash of the server with several slots busy
(tests/faults/test_slots_faults.py): each slot thread kept its Django connection from job to
job, and after the server restarted, the next handler to touch the database on each such
thread failed on the dead connection; a job that landed on three of them in a row had spent
its three attempts within 0.2 s and ended `failed` without its effect.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from jobs import enqueue, handler
from jobs.models import Job
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


@handler("tests.slot_connections.hold", atomic=False)
def hold(payload: dict) -> None:
    """Opens this slot thread's connection, writes its backend's pid, then waits (without
    touching the database) until the test has ended that backend."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{pid}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + 60
    while not os.path.exists(payload["until"]) and time.monotonic() < deadline:
        time.sleep(0.01)


@handler("tests.slot_connections.write")
def write(payload: dict) -> None:
    get_user_model().objects.create(username=f"after-{payload['n']}")


@handler("tests.slot_connections.effect", atomic=False)
def effect(payload: dict) -> None:
    """A non-idempotent external effect, once the test says so (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(payload["until"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"effect\n")
    finally:
        os.close(fd)


def _pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().splitlines()] if log.exists() else []


def _alive(pids: list[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return cursor.fetchone()[0]


def test_a_job_after_the_server_ended_its_slots_connection_runs_on_a_fresh_one(settings, tmp_path):
    """Two slots each hold a connection; the server ends both while their handlers run;
    the next two jobs (one attempt each) run on those two threads and complete."""
    settings.JOBS_CONCURRENCY = 2
    log, until = tmp_path / "pids.log", tmp_path / "ended"
    for _ in range(2):
        enqueue("tests.slot_connections.hold", {"log": str(log), "until": str(until)}, priority=9)
    after = [enqueue("tests.slot_connections.write", {"n": n}, max_attempts=1) for n in range(2)]
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        wait_until(lambda: len(_pids(log)) == 2, "both slots holding a connection", timeout=20)
        pids = _pids(log)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        wait_until(lambda: _alive(pids) == 0, "the slots' backends gone", timeout=20)
    finally:
        until.touch()
        thread.join(60)

    for job in after:
        job.refresh_from_db()
        assert (job.status, job.last_error) == (Job.Status.COMPLETED, "")
    assert get_user_model().objects.filter(username__startswith="after-").count() == 2
    assert (result["summary"].completed, result["summary"].failed) == (4, 0)


def _end_the_drains_poll() -> int:
    """End the drain's connection: its last statement is the poll for due jobs it makes
    every JOBS_LINGER_POLL_SECONDS while it waits for a slot."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND query LIKE %s",
            ["%django_q_ormq%"],
        )
        return cursor.fetchone()[0]


def test_the_drains_connection_ended_while_it_waits_for_a_slot_loses_no_completion(
    settings, tmp_path
):
    """Found by the fault harness (tests/faults/test_slots_faults.py): the poll's error ended
    the drain, the running job's completion was then sent on the dead connection and left to
    the reaper, and a job whose handler had returned ran again, its effect twice, though no
    process died. Now the poll reconnects, and the job completes once."""
    settings.JOBS_CONCURRENCY = 2
    log, until = tmp_path / "effects.log", tmp_path / "go"
    job = enqueue("tests.slot_connections.effect", {"log": str(log), "until": str(until)})
    result: dict = {}
    thread = drain_in_thread(result)
    try:
        wait_until(lambda: _end_the_drains_poll() > 0, "the drain polling", timeout=20)
        time.sleep(0.5)  # ten polls: the next one meets the ended connection
    finally:
        until.touch()
        thread.join(60)

    assert "summary" in result, "the drain raised"
    job.refresh_from_db()
    assert (job.status, job.attempts) == (Job.Status.COMPLETED, 1)
    assert log.read_text() == "effect\n"
    assert (result["summary"].completed, result["summary"].lost) == (1, 0)
