"""A claim that could take nothing because every slot was busy must not raise the claim
floor past the jobs still waiting.

With slots (issue 37) a claim takes no more than the drain's free slots can start
(`jobs_runner_step_v6`'s room). While every thread slot is busy, the drain's poll still
asks for a claim when a job is due; that claim scans no lane (each takes 0 rows) and
reported the database's clock as the floor it "saw", so the process's floor rose above every
job queued before it. The next claims, floored, found nothing until the next full scan: a
`run_jobs --burst` drain ended with jobs still queued (seen once in
tests/jobs/test_concurrency.py: two workers exited after 550 of 2,000 jobs), and a
qcluster's drain left them for the full scan's period (up to 30 s next to a pinned
snapshot)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db.backends.signals import connection_created
from django.utils import timezone

from jobs import enqueue, enqueue_many
from jobs.models import Job
from tests.jobs.stop_handlers import GATES
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_made_while_every_slot_is_busy_leaves_the_floor_below_the_waiting_jobs(settings):
    """Two slots, both held by gated jobs; twenty quick jobs queued behind them, back-dated
    30 s. While the gated jobs run, the drain polls and claims with no free slot. Once the
    gates open, the burst drain must run all twenty: none may be left queued behind a floor
    raised by a claim that scanned nothing."""
    settings.JOBS_CONCURRENCY = 2
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 600  # no full scan rescues what a floor hides
    name = f"floor-room-{time.monotonic_ns()}"
    for n in range(2):
        enqueue("tests.stop.gated", {"name": f"{name}-{n}"})
    enqueue_many("tests.stop.quick", [{"name": name, "n": n} for n in range(20)])
    Job.objects.update(run_after=timezone.now() - timedelta(seconds=30))

    steps = _RunnerSteps()
    result: dict = {}
    with steps.counted():
        thread = drain_in_thread(result)
        try:
            for n in range(2):
                assert GATES[f"{name}-{n}.started"].wait(20), "a gated job never started"
            busy_from = steps.count
            # The drain polls every JOBS_LINGER_POLL_SECONDS (50 ms): a job is due, so it
            # sends a claim, with both slots busy.
            wait_until(lambda: steps.count > busy_from, "a claim while both slots ran", timeout=10)
        finally:
            for n in range(2):
                GATES[f"{name}-{n}.release"].set()
            thread.join(60)
    assert not thread.is_alive()
    left = Job.objects.filter(kind="tests.stop.quick").exclude(status=Job.Status.COMPLETED)
    assert list(left.values_list("status", flat=True)) == [], (
        f"the burst drain ended with {left.count()} quick jobs not run: {result.get('summary')}"
    )
    assert Job.objects.filter(status=Job.Status.COMPLETED).count() == 22


class _RunnerSteps:
    """Counts the runner's statements on connections opened while `counted()` is active
    (the drain thread's): Django's execute wrapper on each new connection, nothing replaced."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def _wrapper(self, execute, sql, params, many, context):  # noqa: ANN001 - Django's hook
        if "jobs_runner_step" in sql:
            with self._lock:
                self.count += 1
        return execute(sql, params, many, context)

    def _on_connection(self, sender, connection, **kwargs) -> None:  # noqa: ANN001
        if threading.current_thread() is not threading.main_thread():
            connection.execute_wrappers.append(self._wrapper)

    @contextmanager
    def counted(self) -> Iterator[None]:
        connection_created.connect(self._on_connection)
        try:
            yield
        finally:
            connection_created.disconnect(self._on_connection)
