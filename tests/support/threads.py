"""Run the same work in several threads at once, as two workers or pollers would."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connection


def run_side_by_side(
    work: Callable[[], object],
    *,
    copies: int = 2,
    timeout: float = 60,
    on_error: Callable[[], object] | None = None,
) -> list[BaseException]:
    """Run `work` in `copies` threads and wait for them; return what they raised (a thread
    still running after `timeout` counts as a TimeoutError, so it doubles as a hang guard for
    one call: `copies=1`). Each thread closes its own
    database connection. `on_error` runs in the failing thread, e.g. to break a barrier the
    other threads wait on."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # returned to the test, which asserts there were none
            errors.append(exc)
            if on_error is not None:
                on_error()
        finally:
            connection.close()

    # Daemon threads: one still hung after `timeout` must not keep the test process alive.
    threads = [threading.Thread(target=run, daemon=True) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
        if thread.is_alive():
            errors.append(TimeoutError(f"{thread.name} still running after {timeout} s"))
    return errors


class Background:
    """One call running in its own thread, as another worker would, while the test goes on:
    `result()` waits for it and returns what it returned (or raises what it raised). The
    thread closes its own database connection."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._outcome: list[object] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._outcome.append(work())
            except BaseException as exc:  # re-raised by result()
                self._error.append(exc)
            finally:
                connection.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 60) -> object:
        self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self._thread.name} still running after {timeout} s")
        if self._error:
            raise self._error[0]
        return self._outcome[0]


def drain_in_thread(result: dict, **options: object) -> threading.Thread:
    """Start `run_pending(**options)` in a thread, as a worker process's drain runs beside
    the test; its summary lands in `result["summary"]`, and the thread closes its own
    connection."""
    from jobs.runner import run_pending

    def drain() -> None:
        try:
            result["summary"] = run_pending(**options)
        finally:
            connection.close()

    thread = threading.Thread(target=drain)
    thread.start()
    return thread
