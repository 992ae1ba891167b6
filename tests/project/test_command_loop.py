"""The stop handling shared by `run_jobs`, `poll_inbound_email` and `run_sweeps`."""

from __future__ import annotations

import io
import os
import signal

import pytest

from project.command_loop import run_until_stopped, stopped_by_signals


def _previous_handler(signum, frame):  # a handler the test can recognise afterwards
    raise AssertionError("the command's own handler should have caught SIGTERM")


@pytest.fixture
def own_sigterm_handler():
    before = signal.signal(signal.SIGTERM, _previous_handler)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_finishes_the_step_then_ends_the_loop(own_sigterm_handler):
    out = io.StringIO()
    steps: list[bool] = []

    def step(stop):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the step is running
        steps.append(stop.is_set())
        return "done"

    run_until_stopped(step, what="test loop", idle_seconds=lambda _result: 0, stdout=out)

    assert steps == [True]  # the running step finished; no further step started
    assert out.getvalue() == "SIGTERM: stopped"
    assert signal.getsignal(signal.SIGTERM) is _previous_handler


def test_a_failing_step_is_retried_not_fatal(own_sigterm_handler, caplog):
    out = io.StringIO()
    calls: list[int] = []

    def step(stop):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("one bad pass")
        os.kill(os.getpid(), signal.SIGTERM)

    run_until_stopped(step, what="test loop", idle_seconds=lambda _result: 0, stdout=out)

    assert len(calls) == 2
    assert "test loop failed (RuntimeError: one bad pass)" in caplog.text
    assert out.getvalue() == "SIGTERM: stopped"


def test_ctrl_c_is_reported_and_the_handler_restored(own_sigterm_handler):
    out = io.StringIO()

    def step(stop):
        raise KeyboardInterrupt

    run_until_stopped(step, what="test loop", idle_seconds=lambda _result: 0, stdout=out)

    assert out.getvalue() == "interrupted: stopped"
    assert signal.getsignal(signal.SIGTERM) is _previous_handler


def test_stopped_by_signals_lets_other_errors_through(own_sigterm_handler):
    with pytest.raises(ValueError), stopped_by_signals(io.StringIO()):
        raise ValueError("not a stop")
    assert signal.getsignal(signal.SIGTERM) is _previous_handler
