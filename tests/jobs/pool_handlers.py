"""Handlers of the connection pool tests (tests/jobs/test_slot_pool.py), in a `run_jobs`
child (JOBS_EXTRA_HANDLER_MODULES=tests.jobs.pool_handlers): they meet the test through the
file named in the payload."""

from __future__ import annotations

import os
import time

from django.db import connection

from jobs import handler


@handler("tests.pool.query_then_wait", atomic=False)
def query_then_wait(payload: dict) -> None:
    """One query (its server backend's pid, appended to the payload's log), then a wait
    without the database: an I/O-bound handler that touched the database once."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    fd = os.open(payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {pid}\n".encode())
    finally:
        os.close(fd)
    time.sleep(payload.get("seconds", 0.2))
