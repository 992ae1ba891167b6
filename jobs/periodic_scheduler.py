"""The loop that enqueues a job per tick of each `jobs.periodic` schedule (issue 38, point 4).

It runs on a thread of each qcluster's main process, the one process that lives for the
cluster's whole run (started beside the counter rollup's thread, ops/rollup_ticker.py), and
sleeps until the next tick of any schedule, so intervals down to one second hold. Every
qcluster on every host runs one; the database decides which of them enqueues a tick:

- `fire()` inserts the tick's row, keyed by (schedule, tick time), with ON CONFLICT DO
  NOTHING, and only the transaction whose insert wrote the row enqueues the job, in that same
  transaction (`jobs.enqueueing.enqueue`). A second inserter of the same key waits for the
  first's commit and then writes nothing; if the first rolled back, the second enqueues. The
  rows have no foreign key to the job, so they outlive its pruning and a tick never re-fires.
- At start (`catch_up`) a schedule whose last recorded tick is older than its latest due tick
  runs that latest tick once; the ticks in between are skipped, in one log line with their
  count and range. A schedule with no recorded tick is new: it starts at its next tick.
- Unless declared with `overlap=True`, a tick is recorded as `overlap` (no job) while the job
  of the schedule's last enqueued tick is still queued or processing, and the skip is logged.

Times are the database's clock (project/db_clock.py), which every host shares.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, connections, transaction

from jobs.enqueueing import enqueue
from jobs.periodic_ticks import Periodic, count_between, declared, latest_tick, next_tick
from project.db_clock import db_now
from project.quiet_log import QuietLog

logger = logging.getLogger(__name__)

THREAD_NAME = "periodic-scheduler"
MAX_SLEEP_SECONDS = 30.0  # re-read the database's clock at least this often

_RUNNING_JOB_SQL = """
SELECT j.id FROM (
    SELECT job_id FROM jobs_periodic_tick
    WHERE schedule = %s AND job_id IS NOT NULL
    ORDER BY tick_at DESC LIMIT 1
) AS last JOIN jobs_job AS j ON j.id = last.job_id AND j.status IN ('queued', 'processing')
"""
_INSERT_TICK_SQL = """
INSERT INTO jobs_periodic_tick (schedule, tick_at, outcome) VALUES (%s, %s, %s)
ON CONFLICT (schedule, tick_at) DO NOTHING RETURNING 1
"""


def fire(schedule: Periodic, tick: datetime) -> str:
    """Record `tick` of `schedule` and enqueue its job, in one transaction.

    Returns "enqueued", "overlap" (recorded, no job: the previous job is still running) or
    "taken" (another scheduler recorded this tick first: nothing written).
    """
    with transaction.atomic(), connection.cursor() as cursor:
        running = None
        if not schedule.overlap:
            cursor.execute(_RUNNING_JOB_SQL, [schedule.name])
            row = cursor.fetchone()
            running = row[0] if row else None
        outcome = "enqueued" if running is None else "overlap"
        cursor.execute(_INSERT_TICK_SQL, [schedule.name, tick, outcome])
        if cursor.fetchone() is None:
            return "taken"
        if running is not None:
            logger.info(
                "periodic %s: tick %s skipped, job #%s of an earlier tick is still running "
                "(declare overlap=True to allow it)",
                schedule.name,
                tick.isoformat(),
                running,
                extra={"action": "periodic_overlap_skipped", "schedule": schedule.name},
            )
            return "overlap"
        job = enqueue(schedule.kind, dict(schedule.payload))
        cursor.execute(
            "UPDATE jobs_periodic_tick SET job_id = %s WHERE schedule = %s AND tick_at = %s",
            [job.pk, schedule.name, tick],
        )
    logger.info(
        "periodic %s: tick %s enqueued job #%s",
        schedule.name,
        tick.isoformat(),
        job.pk,
        extra={"action": "periodic_enqueued", "schedule": schedule.name, "job_id": job.pk},
    )
    return "enqueued"


def last_recorded_ticks(names: Sequence[str]) -> dict[str, datetime]:
    """Each schedule's latest recorded tick (enqueued or skipped for overlap)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT schedule, max(tick_at) FROM jobs_periodic_tick "
            "WHERE schedule = ANY(%s) GROUP BY schedule",
            [list(names)],
        )
        return dict(cursor.fetchall())


class PeriodicScheduler:
    """Enqueue each declared schedule's ticks as they come; `step(now)` is one pass."""

    def __init__(self, schedules: Sequence[Periodic] | None = None) -> None:
        self.schedules = list(schedules) if schedules is not None else None
        self._last: dict[str, datetime] = {}  # the latest tick this scheduler has settled
        self._started = False
        self.fired: dict[str, int] = {}  # outcome -> count, for tests and status
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._quiet = QuietLog(logger, "periodic scheduler")

    # --- one pass, testable without a thread ------------------------------------------------

    def catch_up(self, now: datetime) -> None:
        """At start: run each schedule's most recent missed tick once, log the older ones."""
        if self.schedules is None:
            self.schedules = declared()
        recorded = last_recorded_ticks([s.name for s in self.schedules])
        for schedule in self.schedules:
            latest = latest_tick(schedule, now)
            last = recorded.get(schedule.name)
            if last is None or latest is None or latest <= last:
                # New (nothing was missed: it starts at its next tick) or up to date.
                self._last[schedule.name] = max(filter(None, (last, latest)), default=now)
                continue
            self._skip(schedule, last, latest)
            self._settle(schedule, latest)
        self._started = True

    def step(self, now: datetime) -> None:
        """Enqueue each schedule's latest tick at or before `now` not settled yet."""
        if not self._started:
            self.catch_up(now)
            return
        for schedule in self.schedules or ():
            latest = latest_tick(schedule, now)
            last = self._last[schedule.name]
            if latest is None or latest <= last:
                continue
            self._skip(schedule, last, latest)  # a pause longer than the interval
            self._settle(schedule, latest)

    def seconds_to_next(self, now: datetime) -> float:
        """How long to sleep until the next tick of any schedule (at most MAX_SLEEP_SECONDS)."""
        wait = MAX_SLEEP_SECONDS
        for schedule in self.schedules or ():
            tick = next_tick(schedule, max(self._last.get(schedule.name, now), now))
            if tick is not None:
                wait = min(wait, (tick - now).total_seconds())
        return max(wait, 0.0)

    def _settle(self, schedule: Periodic, tick: datetime) -> None:
        outcome = fire(schedule, tick)
        self.fired[outcome] = self.fired.get(outcome, 0) + 1
        self._last[schedule.name] = tick

    def _skip(self, schedule: Periodic, last: datetime, latest: datetime) -> None:
        skipped = count_between(schedule, last, latest)
        if not skipped:
            return
        first = next_tick(schedule, last)
        logger.warning(
            "periodic %s: %d missed tick(s) skipped, from %s to %s; running the latest, %s",
            schedule.name,
            skipped,
            first.isoformat() if first else "?",
            (latest - timedelta(microseconds=1)).isoformat(timespec="seconds"),
            latest.isoformat(),
            extra={
                "action": "periodic_ticks_skipped",
                "schedule": schedule.name,
                "skipped": skipped,
            },
        )

    # --- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            wait = 0.0
            while not self._stopping.wait(wait):
                try:
                    self.step(db_now())
                    wait = self.seconds_to_next(db_now())
                except Exception as exc:  # noqa: BLE001 - the loop's one catch-all: log, retry
                    self._quiet.failed(
                        exc,
                        "periodic scheduler: could not enqueue the due ticks",
                        then="; trying again in 1 s",
                        extra={"action": "periodic_scheduler_failed"},
                    )
                    connections.close_all()  # this thread's; a broken one is opened anew
                    wait = 1.0
                    continue
                self._quiet.recovered()
        finally:
            connections.close_all()


@contextmanager
def periodic_scheduler_running(
    schedules: Sequence[Periodic] | None = None,
) -> Iterator[PeriodicScheduler]:
    """Enqueue the periodic schedules' ticks on a thread inside the block."""
    scheduler = PeriodicScheduler(schedules)
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()
