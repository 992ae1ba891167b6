"""Issue 36, point 1: every committed due job that can start starts within a second of its
commit, whoever inserted it and whatever its `run_after`.

Two ways it did not, on a real qcluster:

- a producer's transaction that stays open while the workers run other jobs commits a job
  whose `run_after` (its transaction's start) lies below every claimer's floor
  (jobs/claim_floor.py); once the traffic stopped, nothing scanned below the floors until
  the minute schedule;
- a paused kind's backlog of 1,000,000 queued rows was walked by every full scan of the
  claim index (the pause was a filter, not an index condition), so the full scans came
  twenty times that scan apart and a back-dated job waited for one.

What is asserted is the guarantee, a start within 1 s of the commit (on the database's
clock: the job's `started_at` against `clock_timestamp()` read just before the COMMIT), not
how fast it usually is; and, for the backlog, that the scans on the claim's path do not read
the paused rows (their buffers, from the plans).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from django.db import connection, connections

from jobs import selectors
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from jobs.models import Job, PausedKind
from jobs.selectors import job_due_or_task_waiting
from tests.jobs.test_wakeup import _qcluster
from tests.support.plans import explained, runner_step_buffers
from tests.support.wakeup import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

GUARANTEE_SECONDS = 1.0
TRAFFIC_PER_SECOND = 40
OPEN_SECONDS = 3.5  # how long the producer's transaction stays open after its INSERT
BACKLOG = 1_000_000

_INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
VALUES (%s, '{}', 'queued', 0, 0, 3, now(), now(), '', '')
RETURNING id
"""


@contextmanager
def _traffic(kind: str = "tests.noop") -> Iterator[threading.Event]:
    """Plain-SQL no-op jobs at TRAFFIC_PER_SECOND, one per transaction, until the event
    yielded is set (or the block ends): the workers stay busy and their floors climb."""
    stop = threading.Event()

    def produce() -> None:
        with raw_connection() as conn:
            while not stop.wait(1 / TRAFFIC_PER_SECOND):
                conn.execute(_INSERT, [kind])

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=10)


def _back_dated_commit(*, then_stop: threading.Event | None = None) -> tuple[int, datetime]:
    """A job inserted in a transaction that stays open OPEN_SECONDS (a web request, an
    import) while other jobs run: its `run_after` is its transaction's start, OPEN_SECONDS
    before the commit. Returns its id and the database's clock just before the COMMIT;
    `then_stop` is set right after it (the traffic stops)."""
    with raw_connection() as conn:
        conn.execute("BEGIN")
        (job_id,) = conn.execute(_INSERT, ["tests.noop"]).fetchone()
        time.sleep(OPEN_SECONDS)
        (committing,) = conn.execute("SELECT clock_timestamp()").fetchone()
        conn.execute("COMMIT")
    if then_stop is not None:
        then_stop.set()
    return job_id, committing


def _started_after_commit(job_id: int, committing: datetime, log) -> float:
    """Seconds from the commit to the job's handler start, on the database's clock. Waits
    up to 70 s (past the minute schedule, which the qcluster helper moved an hour away) so
    that a miss shows how late it was."""
    deadline = time.monotonic() + 70
    while True:
        job = Job.objects.get(pk=job_id)
        if job.status == Job.Status.COMPLETED:
            return (job.started_at - committing).total_seconds()
        assert time.monotonic() < deadline, f"job {job_id} never ran\n{log.read_text()[-4000:]}"
        time.sleep(0.05)


def _cluster_env(worker_env: dict[str, str], **overrides: str) -> dict[str, str]:
    return {
        **worker_env,
        "Q_WORKERS": "2",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
        **overrides,
    }


@pytest.mark.slow
def test_a_back_dated_commit_starts_within_a_second_with_and_without_traffic_after_it(
    worker_env, tmp_path
):
    """The full scans are 30 s apart here (JOBS_CLAIM_FULL_SCAN_SECONDS), as a pinned
    snapshot makes them (FULL_SCAN_MAX_PERIOD_SECONDS): so the test does not hope that some
    process's full scan happens to come by within the second. On main the job waited for
    that full scan or the minute schedule (19.7 to 57.4 s in the issue)."""
    env = _cluster_env(worker_env, JOBS_CLAIM_FULL_SCAN_SECONDS="30")
    log = tmp_path / "qcluster.log"
    waits = {}
    with _qcluster(env, log):
        with _traffic():
            job_id, committing = _back_dated_commit()
            time.sleep(2)  # the traffic goes on after the commit
        waits["traffic after it"] = _started_after_commit(job_id, committing, log)
        time.sleep(3)  # the drains' lingers end: nothing runs
        with _traffic() as stop:
            job_id, committing = _back_dated_commit(then_stop=stop)  # the traffic stops
        waits["traffic stopped"] = _started_after_commit(job_id, committing, log)
        job_id, committing = _back_dated_commit()  # no traffic at all
        waits["no traffic"] = _started_after_commit(job_id, committing, log)
    print("commit to start:", {k: f"{v:.3f}s" for k, v in waits.items()})
    assert all(0 <= wait <= GUARANTEE_SECONDS for wait in waits.values()), waits


def _runner_step_buffers() -> int:
    """The buffers of the runner's claim, a full scan (no floor)."""
    used, step, _plans = runner_step_buffers(floor=None)
    assert step.claimed == []
    return used


@pytest.mark.slow
def test_a_paused_kinds_million_queued_rows_cost_the_claim_nothing(worker_env, tmp_path):
    """1,000,000 queued rows of a paused kind, back-dated an hour (below every floor, as a
    backlog waiting out a pause is): the scans on the claim's path (the runner's claim and
    its `more_due`, the linger poll, the listener's due check and look-ahead), each a full
    scan, read a handful of buffers, not the backlog's; and a back-dated job of another
    kind committed next to it starts within a second, traffic running, full scans at their
    default period."""
    PausedKind.objects.create(kind="tests.paused")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT 'tests.paused', '{}', 'queued', 0, 0, 3, "
            "now() - interval '1 hour' + g * interval '1 ms', now(), '', '' "
            "FROM generate_series(1, %s) AS g",
            [BACKLOG],
        )
        # A lane that may run, with nothing due in it: its range is read, the paused one not.
        cursor.execute(
            _INSERT.replace("now(), now()", "now() + interval '1 hour', now()"), ["tests.noop"]
        )
        cursor.execute("VACUUM ANALYZE jobs_job")

    costs = {
        "runner claim (full scan)": _runner_step_buffers(),
        "listener due check (full)": explained(due_now_sql(None)),
        "listener look-ahead": explained(LOOK_AHEAD_SQL),
    }
    # The linger poll's statement, with its parameters, as the drain sends it.
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (now,) = cursor.fetchone()
    costs["linger poll (full scan)"] = explained(selectors._LINGER_SQL, [now, None])
    assert job_due_or_task_waiting(now=now).due_run_after is None  # the paused rows are not due
    print("buffers read per scan next to the paused backlog:", costs)
    # A scan that walked the backlog reads ~1,000,000 buffers (one heap visit per row) or,
    # floored, ~4,000 index pages; one that does not, a few dozen.
    assert all(buffers < 200 for buffers in costs.values()), costs

    log = tmp_path / "qcluster.log"
    with _qcluster(_cluster_env(worker_env), log):
        with _traffic():
            time.sleep(3)  # the workers' floors climb, their full scans run
            job_id, committing = _back_dated_commit()
            wait = _started_after_commit(job_id, committing, log)
    print(f"commit to start next to the paused backlog: {wait:.3f}s")
    assert 0 <= wait <= GUARANTEE_SECONDS
    assert not Job.objects.filter(kind="tests.paused").exclude(status="queued").exists()
    connections.close_all()
