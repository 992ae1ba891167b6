"""Issue 29, point 5: a qcluster drain that runs out of jobs lingers for the next one.

Out of jobs, `run_pending(linger=…)` asks every JOBS_LINGER_POLL_SECONDS whether a job is
due (one read of the claim index, nothing written) until the linger ends, so a job
enqueued meanwhile starts within that poll instead of after a wake task has gone through
django-q2's broker. Speed is measured by bench/latency.py; these tests hold the behaviour
and the cost of an idle worker.
"""

from __future__ import annotations

import threading

import pytest

from jobs import enqueue
from jobs.runner import run_pending
from tests.support.lost_answer import EveryConnection
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


class _Statements(EveryConnection):
    """Every statement the process sends while the block runs (any thread)."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        super().__init__(self._record)

    def _record(self, execute, sql, params, many, context):
        self.sql.append(sql)
        return execute(sql, params, many, context)


def test_a_job_enqueued_while_a_drain_lingers_is_started_by_it(tmp_path):
    log = tmp_path / "runs.log"
    stop = threading.Event()
    result: dict = {}
    with _Statements() as statements:
        thread = drain_in_thread(result, linger=60, stop=stop)
        try:
            # Its claim found nothing; it now waits for a job instead of returning.
            wait_until(lambda: any("EXISTS" in sql for sql in statements.sql), "lingering")
            assert thread.is_alive()
            enqueue("tests.log", {"log": str(log), "n": 1})
            wait_until(log.exists, "the job started by the lingering drain")
        finally:
            stop.set()
            thread.join(30)
    summary = result["summary"]
    assert (summary.claimed, summary.completed) == (1, 1)


def test_an_idle_drain_sends_one_read_per_poll_and_writes_nothing(settings):
    """At most one cheap query per idle worker per JOBS_LINGER_POLL_SECONDS: over a 1 s
    linger at 0.05 s, the claim that found nothing, then at most 20 reads of the claim
    index (fewer if the machine is slow), no write."""
    settings.JOBS_LINGER_POLL_SECONDS = 0.05
    with _Statements() as statements:
        summary = run_pending(linger=1.0)
    assert summary.claimed == 0
    runner_steps = [sql for sql in statements.sql if "jobs_runner_step" in sql]
    reads = [sql for sql in statements.sql if "jobs_runner_step" not in sql]
    assert len(runner_steps) == 1
    assert 1 <= len(reads) <= 20
    assert all(sql.lstrip().startswith("SELECT EXISTS") for sql in reads), reads


def test_a_lingering_drain_returns_when_a_task_waits_for_a_worker():
    """A drain lingering for jobs must not keep the cluster's other work (a schedule's task,
    a wake-up) waiting: when nothing is due and a django-q2 task waits in the broker, the
    drain returns, so its worker can take the task."""
    from django.utils import timezone
    from django_q.models import OrmQ

    result: dict = {}
    with _Statements() as statements:
        thread = drain_in_thread(result, linger=60)
        try:
            wait_until(lambda: any("EXISTS" in sql for sql in statements.sql), "lingering")
            OrmQ.objects.create(key="worker", payload="a task", lock=timezone.now())
            thread.join(30)
            assert not thread.is_alive(), "the drain kept lingering with a task waiting"
        finally:
            OrmQ.objects.all().delete()
            thread.join(60)
    assert result["summary"].claimed == 0


def test_the_wake_up_listener_nudges_a_lingering_drain_at_once(tmp_path, settings):
    """The qcluster opens a pipe before it forks (jobs/linger_signal.py); the listener,
    hearing the jobs table's NOTIFY, nudges the lingering drains through it, so a job starts
    without waiting for the drain's next read. The poll here is 600 s: only the nudge can
    start the job within the wait below."""
    from django.utils import timezone
    from django_q.models import OrmQ

    from jobs import linger_signal
    from tests.jobs.test_wakeup import _running_listener

    settings.JOBS_LINGER_POLL_SECONDS = 600
    log = tmp_path / "runs.log"
    result: dict = {}
    linger_signal.open_signal()
    try:
        with _running_listener(workers=2), _Statements() as statements:
            thread = drain_in_thread(result, linger=600)
            try:
                wait_until(
                    lambda: any("jobs_runner_step" in sql for sql in statements.sql),
                    "the drain's first, empty claim",
                )
                enqueue("tests.log", {"log": str(log), "n": 1})
                wait_until(log.exists, "the job started by the nudged drain", timeout=60)
            finally:
                # End the linger: nothing due and a task waiting for a worker.
                OrmQ.objects.create(key="stop", payload="stop", lock=timezone.now())
                linger_signal.nudge()
                thread.join(30)
                OrmQ.objects.all().delete()
    finally:
        linger_signal.close_signal()
    assert not thread.is_alive()
    assert (result["summary"].claimed, result["summary"].completed) == (1, 1)
