"""The stop handling every long-running management command shares.

`run_jobs`, `poll_inbound_email` and `run_sweeps` run for weeks under a process manager that
stops them with SIGTERM (`docker stop`, systemd) and, by hand, with Ctrl-C. Each must finish
what it is doing, give nothing up half-done, restore the handler it replaced (tests call
commands in-process) and say why it ended, so a supervisor's log shows a clean stop rather
than a crash.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from processes.beacon import beacon_running
from project.reconnect import service_loop


@contextmanager
def stopped_by_signals(stdout: TextIO) -> Iterator[threading.Event]:
    """Yield an event that SIGTERM sets; report Ctrl-C as "interrupted: stopped".

    The signal only sets the event: the code inside checks it between units of work, so a
    running job or mail is finished, not torn. Ctrl-C (KeyboardInterrupt) ends the block at
    once, after the code it interrupted has recorded what it was doing.
    """
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield stop
    except KeyboardInterrupt:
        stdout.write("interrupted: stopped")
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_until_stopped(
    step: Callable[[threading.Event], Any],
    *,
    what: str,
    idle_seconds: Callable[[Any], float],
    stdout: TextIO,
    role: str | None = None,
) -> None:
    """Call `step(stop)` in a reconnecting `service_loop` until SIGTERM or Ctrl-C. With a
    `role` (a processes.models.WorkerProcess.Role) the process is in the process registry,
    beating, all the while (issue 20)."""
    with stopped_by_signals(stdout) as stop, _registered(role):
        service_loop(lambda: step(stop), what=what, stop=stop, idle_seconds=idle_seconds)
        stdout.write("SIGTERM: stopped")


@contextmanager
def _registered(role: str | None) -> Iterator[None]:
    if role is None:
        yield
        return
    with beacon_running(role=role):
        yield
