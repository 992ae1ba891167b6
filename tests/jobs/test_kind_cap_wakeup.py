"""When a unit of a capped kind frees, a waiting job of that kind starts within a second
(issue 37, point 2). The claimers skip a kind at its cap, so their floors climb past its
waiting jobs, and nothing queued a row when the unit freed: on main the wake-up fired only on
queued rows. The jobs table's trigger (migration 0022) now NOTIFYs, with the waiting job's
`run_after`, when a capped kind's row leaves `processing` by any path while a job of that
kind is due; a real qcluster then starts it within the second, even with no other traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connection, connections

from jobs.exceptions import PermanentJobError
from jobs.models import Job, KindCap
from jobs.outcomes import job_record_failure
from jobs.reaper import jobs_reap_stale
from jobs.runner_step import ClaimedJob, job_runner_step
from jobs.wakeup import read_payload
from tests.jobs.handlers import CAPPED_ONE_KIND
from tests.jobs.test_start_within_a_second import GUARANTEE_SECONDS, _cluster_env
from tests.jobs.test_wakeup import _qcluster
from tests.support.wakeup import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "tests.capped_one"  # capped to 1 by its handler; the row is written here for the unit tests


def _queue(kind: str, ago: str = "1 minute", payload: str = "{}") -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "VALUES (%s, %s, 'queued', 0, 0, 3, now() - %s::interval, now(), '', '') "
            "RETURNING id",
            [kind, payload, ago],
        )
        return cursor.fetchone()[0]


def _payloads(listener, wait: float) -> list[float]:
    return [read_payload(n.payload)[1] for n in listener.notifies(timeout=wait)]


def _held_one_and_waiting(kind: str) -> tuple[ClaimedJob, int]:
    """Two due jobs of `kind`; the first claimed by worker `w` (its unit), the second waiting."""
    first = _queue(kind, ago="2 minutes")
    waiting = _queue(kind, ago="1 minute")
    (held,) = job_runner_step(worker="w", claim=1).claimed
    assert held.id == first
    return held, waiting


def _complete(job: ClaimedJob) -> None:
    assert job_runner_step(worker="w", done=[(job.id, 0.1)]).completed == {job.id}


def _fail_for_good(job: ClaimedJob) -> None:
    assert job_record_failure(job=job, worker="w", exc=PermanentJobError("no")) == "failed"


def _retry_later(job: ClaimedJob) -> None:
    assert job_record_failure(job=job, worker="w", exc=RuntimeError("flaky")) == "retried"


def _reap(job: ClaimedJob) -> None:
    Job.objects.filter(pk=job.id).update(heartbeat_at=datetime(2000, 1, 1, tzinfo=UTC))
    assert [r.id for r in jobs_reap_stale(older_than=60)] == [job.id]


def _give_back(job: ClaimedJob) -> None:
    assert job_runner_step(worker="w", release=[job.id]).released == 1


@pytest.mark.parametrize(
    "leave",
    [_complete, _fail_for_good, _retry_later, _reap, _give_back],
    ids=["completed", "failed", "retried", "reaped", "given back"],
)
def test_a_capped_row_leaving_processing_notifies_with_the_waiting_jobs_run_after(leave):
    KindCap.objects.create(kind=KIND, concurrency=1)
    held, waiting = _held_one_and_waiting(KIND)
    waiting_at = Job.objects.get(pk=waiting).run_after.timestamp()
    with raw_connection() as listener:
        listener.execute("LISTEN jobs_job_due")
        leave(held)
        payloads = _payloads(listener, 3.0)
    assert payloads, "nobody was told that a unit freed"
    # due now, and at or below the waiting job's run_after: the claimers scan from there
    assert min(payloads) <= waiting_at + 1e-3, (payloads, waiting_at)


def test_no_notification_when_nothing_waits_for_the_unit_or_the_kind_has_no_cap():
    KindCap.objects.create(kind=KIND, concurrency=1)
    _queue(KIND)
    (capped,) = job_runner_step(worker="w", claim=5).claimed
    _queue("tests.noop")
    _queue("tests.noop")
    (uncapped,) = job_runner_step(worker="w", claim=1).claimed
    assert uncapped.kind == "tests.noop"
    with raw_connection() as listener:
        listener.execute("LISTEN jobs_job_due")
        _complete(capped)  # nothing of its kind waits
        _complete(uncapped)  # another of its kind waits, but its completion frees no unit
        assert _payloads(listener, 1.0) == []


def _started_after(job_id: int, freed: Callable[[], datetime], log) -> float:
    """Seconds from the unit's freeing (on the database's clock) to `job_id`'s start."""
    deadline = time.monotonic() + 70
    while Job.objects.get(pk=job_id).status != Job.Status.COMPLETED:
        assert time.monotonic() < deadline, f"job {job_id} never ran\n{log.read_text()[-4000:]}"
        time.sleep(0.05)
    return (Job.objects.get(pk=job_id).started_at - freed()).total_seconds()


@pytest.mark.slow
def test_a_waiting_capped_job_starts_within_a_second_of_its_unit_freeing(worker_env, tmp_path):
    """A real qcluster (2 workers) with `tests.capped_one` capped to 1 by its handler, which
    it writes at start-up; full scans 30 s apart, as a pinned snapshot makes them.

    1. Two jobs of the kind queued together: the second starts after the first completed
       (the cap holds) and within a second of it.
    2. The unit held elsewhere (a row claimed by another host's worker, busy with other
       jobs: it completes it without claiming again) while a job waits and the
       qcluster's drains have stopped lingering: no other traffic. On main nothing told the
       qcluster, and the job waited for a full scan or the minute schedule."""
    env = _cluster_env(worker_env, JOBS_CLAIM_FULL_SCAN_SECONDS="30")
    log = tmp_path / "qcluster.log"
    waits = {}
    with _qcluster(env, log):
        assert KindCap.objects.get(kind=CAPPED_ONE_KIND).concurrency == 1  # the start-up sync
        first = _queue(CAPPED_ONE_KIND, ago="0 seconds", payload='{"sleep": 1.5}')
        second = _queue(CAPPED_ONE_KIND, ago="0 seconds")

        def first_completed() -> datetime:
            return Job.objects.get(pk=first).completed_at

        waits["both in the cluster"] = _started_after(second, first_completed, log)

        held = _held_elsewhere(CAPPED_ONE_KIND)
        waiting = _queue(CAPPED_ONE_KIND, ago="0 seconds")
        time.sleep(4)  # the drains woken by the insert claim nothing, linger, and stop
        assert Job.objects.get(pk=waiting).status == Job.Status.QUEUED
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (freeing,) = cursor.fetchone()
        _complete_elsewhere(held)
        waits["freed elsewhere"] = _started_after(waiting, lambda: freeing, log)
    print("unit freed to the waiting job's start:", {k: f"{v:.3f}s" for k, v in waits.items()})
    assert all(0 <= wait <= GUARANTEE_SECONDS for wait in waits.values()), waits
    connections.close_all()


def _held_elsewhere(kind: str) -> ClaimedJob:
    """A row of `kind` another host's worker claimed (written as its claim leaves it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error, heartbeat_at, lease_expires_at) "
            "VALUES (%s, '{}', 'processing', 0, 1, 3, now() - interval '5 seconds', now(), "
            "'elsewhere', '', now(), now() + interval '5 minutes') RETURNING id",
            [kind],
        )
        (job_id,) = cursor.fetchone()
    return ClaimedJob(id=job_id, kind=kind, payload={}, attempts=1, max_attempts=3)


def _complete_elsewhere(job: ClaimedJob) -> None:
    assert job_runner_step(worker="elsewhere", done=[(job.id, 0.1)]).completed == {job.id}
