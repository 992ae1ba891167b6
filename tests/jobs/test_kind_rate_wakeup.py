"""A timer of the wake-up listener (a job due later, a rate-limited kind's next token: issue
38, point 3) nudges the lingering drains at once and, while a drain runs, looks for a due job
to send a wake task for only after its coalescing window, as it does after a NOTIFY. A rate's
tokens come every 1/rate: a wake task at each would end the lingering drains (a waiting
django-q2 task ends a linger), and 3 qclusters kept 20/s at 1.585 times the ideal time
(bench/rates.py). With no drain running, nobody would take the job within the window: the
wake task goes at once (issue 37, point 1: the wake-up of an idle cluster)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections
from django_q.models import OrmQ

from jobs import linger_signal
from jobs.runner_step import job_runner_step
from jobs.wake_tasks import wake_tasks_in_broker
from jobs.wakeup import WakeListener
from tests.support.wakeup import plain_insert

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 1.0  # the listener's coalescing window here: long, so the order cannot be luck


@contextmanager
def _listener() -> Iterator[WakeListener]:
    linger_signal.open_signal()
    listener = WakeListener(workers=2, coalesce_seconds=WINDOW)
    stop = threading.Event()

    def run() -> None:
        try:
            listener.run(should_stop=stop.is_set)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while listener.connects < 1:
        assert time.monotonic() < deadline, "listener did not connect"
        time.sleep(0.02)
    try:
        yield listener
    finally:
        stop.set()
        thread.join(timeout=10)
        linger_signal.close_signal()


def test_a_lingering_drain_takes_the_timers_job_and_no_wake_task_ends_its_linger():
    OrmQ.objects.all().delete()
    claimed: list[int] = []

    def lingering_drain() -> None:
        """Polls, as a lingering drain does (each poll says a drain runs), until nudged;
        then claims a while after (the listener must not have sent a wake task meanwhile)."""
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                linger_signal.looking()
                if linger_signal.wait(0.05):
                    break
            time.sleep(0.3)
            claimed.extend(job.id for job in job_runner_step(worker="d", claim=5).claimed)
        finally:
            connections.close_all()

    with _listener() as listener:
        drain = threading.Thread(target=lingering_drain)
        drain.start()
        job_id = plain_insert("tests.noop", delay="1 second")
        drain.join(timeout=10)
        assert claimed == [job_id]  # nudged by the timer, it took the job
        time.sleep(WINDOW + 0.5)  # the window after the timer has passed: the check ran
        assert listener.wakes_sent == 0
        assert wake_tasks_in_broker() == (0, 0)


def test_with_no_drain_running_the_timers_job_gets_a_wake_task_at_its_due_time():
    """No drain has looked for jobs (the cluster idle past its lingers): the window would
    only delay the job, so the wake task goes at the due time, not a window after it."""
    OrmQ.objects.all().delete()
    with _listener() as listener:
        plain_insert("tests.noop", delay="1 second")
        started = time.monotonic()
        while wake_tasks_in_broker()[1] < 1:
            assert time.monotonic() - started < 1 + WINDOW + 5, "no wake task came"
            time.sleep(0.02)
        waited = time.monotonic() - started
    assert listener.wakes_sent == 1
    assert 1 - 0.2 <= waited < 1 + WINDOW - 0.2, waited  # the due time, no window after it
