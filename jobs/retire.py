"""A worker process that gave up on a handler retires, to be replaced (issue 37, point 6).

A thread cannot be killed: a handler that did not return after it was asked to stop may
still be running, so the process that runs it must end before its job may run again (I21).
By then `run_pending` has stopped claiming, given back what it had not started, let its
other slots finish and left the job `processing` with a short lease (jobs/stops.py:
`job_give_up`). What remains is to end the process:

- in a qcluster worker, django-q2 recycles it after this task (the worker loop ends as at
  its `recycle` count, and the sentinel starts a fresh worker in its place);
- `run_jobs` exits with EXIT_RETIRED (3): its supervisor (docker's restart policy, systemd)
  starts a new one;
- either way a watchdog thread ends the process with `os._exit` if it is still alive after
  half the given-up job's lease, so the reaper can never re-queue a job while its handler
  still runs in a process that failed to exit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time

from jobs.conf import get_config
from jobs.stops import give_up_lease_seconds

logger = logging.getLogger(__name__)

EXIT_RETIRED = 3


def start_watchdog() -> float:
    """End this process within half the given-up lease, whatever else happens; the delay."""
    delay = give_up_lease_seconds(get_config().stop_grace_seconds) / 2

    def watch() -> None:
        time.sleep(delay)
        logger.critical(
            "this process did not exit %.1f s after retiring: ending it now (os._exit)",
            delay,
            extra={"action": "jobs_process_retire_forced"},
        )
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed stream: nothing to flush
                pass
        os._exit(EXIT_RETIRED)

    threading.Thread(target=watch, name="jobs-retire-watchdog", daemon=True).start()
    return delay


def retire_qcluster_worker(hung: list[int]) -> None:
    """In a django-q2 worker process: let this task's result go back, then end the worker
    (django-q2 recycles it: `Conf.MAX_RSS` of 1 KB makes its `rss_check` true after this
    task) so the sentinel replaces it. Elsewhere (Q_SYNC, a test calling the task) only log."""
    _log(hung)
    if multiprocessing.current_process().name == "MainProcess":
        return
    from django_q.conf import Conf

    Conf.MAX_RSS = 1  # this process's copy only: the worker loop breaks after this task
    start_watchdog()


def retire_run_jobs(hung: list[int]) -> None:
    """In `run_jobs`: exit with EXIT_RETIRED; its supervisor starts a new one."""
    _log(hung)
    start_watchdog()
    raise SystemExit(EXIT_RETIRED)


def _log(hung: list[int]) -> None:
    logger.error(
        "retiring this process (pid %s): the handlers of jobs %s did not stop when asked; "
        "it exits to be replaced, and those jobs stay processing until their lease runs out",
        os.getpid(),
        ", ".join(f"#{pk}" for pk in hung),
        extra={"action": "jobs_process_retiring", "jobs": hung},
    )
