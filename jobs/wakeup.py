"""Instant, coalesced wake-up of the runner for every producer of jobs.

A statement-level trigger on jobs_job (migration 0002) sends `NOTIFY jobs_job_due` when a
statement inserts a due queued row, or an update makes a row due (retry now, a released
claim). PostgreSQL delivers it at commit and folds identical notifications of one
transaction into one, so a rolled-back enqueue wakes nobody and a bulk insert wakes once.
It fires whoever writes the row: Django's `enqueue()`, the web app or the Slack bot with a
plain INSERT.

One `WakeListener` per qcluster, in its main process (ops' `qcluster` command), holds a
dedicated psycopg connection that LISTENs, and turns notifications into django-q2 wake
tasks (`jobs.tasks.run_due_jobs`) through `request_wake` (jobs/wake_tasks.py: at most one
pending, at most workers + 1 outstanding). Its statements are jobs/due_check_sql.py's.

The Job table stays the truth and the task carries no job id: a lost notification (the
listener reconnecting, a qcluster down) costs latency only. On every connect, the first
included, the listener checks for due jobs and sends one wake-up for what it may have
missed, and the minute schedule remains the safety net.
"""

from __future__ import annotations

import heapq
import logging
import math
import select
import time
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

from jobs import floor_hints, linger_signal
from jobs.claim_floor import ClaimFloor
from jobs.conf import get_config
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from jobs.wake_tasks import request_wake
from project.backoff import retry_delay
from project.quiet_log import QuietLog

logger = logging.getLogger(__name__)

CHANNEL = "jobs_job_due"  # the trigger's channel (jobs/migrations/0002_notify_due_trigger.py)
DUE_NOW = "now"  # the payload's prefix for a job due now (jobs/migrations/0029_…)
WAIT_SECONDS = 1.0  # longest wait for a notification before checking whether to stop
MAX_COALESCE_SECONDS = 0.25  # longest a burst of notifications is read before the due check
RECONNECT_BASE_SECONDS = 0.5  # backoff between reconnect attempts, doubled up to the cap
RECONNECT_CAP_SECONDS = 30.0
# The listener's connection lives as long as the qcluster: no statement on it may hang it
# (issue 19.10); a timeout is an error like a lost connection, so it reconnects.
STATEMENT_TIMEOUT_MS = 10000
TIMER_MARGIN_SECONDS = 0.005  # a timer fires this long after the due time, never before
KEEPALIVES = {  # libpq TCP keepalives (DATABASES' OPTIONS has the same for every connection)
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
MAX_TIMERS = 1000  # due times remembered; the look-ahead re-arms after the earliest fires
# A due job's `run_after` (or its transaction's start) this close above the line no floor
# can pass (the database's clock less JOBS_CLAIM_FLOOR_MARGIN_SECONDS) is still posted to
# the claimers: the listener reads the database's clock through a round trip (the look-ahead
# every JOBS_LISTENER_PING_SECONDS), so its reading may be behind by that trip's return.
HINT_SLACK_SECONDS = 0.25


class WakeListener:
    """LISTENs on a connection of its own and asks for a wake task when a job is due.

    `run()` returns when `should_stop()` is true (checked at least every WAIT_SECONDS).
    Each notification names the earliest due time of what its statement queued (epoch
    seconds on the database's clock; migration 0005), after `now ` when the trigger found it
    due on that clock (migration 0029): due now, the listener checks at once; due later, it
    keeps a timer for that time (a heap, converted to this host's monotonic clock through
    its estimate of the database's clock, re-read at every ping and due check: a step of
    that clock moves such a timer until the next ping, never a job due now). Every
    JOBS_LISTENER_PING_SECONDS one statement, answered within as long, pings the connection,
    re-reads the database's clock and looks ahead for
    the earliest job due within the next minute (those queued further ahead, or whose
    notification was lost). A wake task is sent only when a due job exists (a NOTIFY flood
    from another role costs one cheap EXISTS per round) and none is pending. Losing the
    connection is expected (server restart, failover): it reconnects with backoff, and
    after each reconnect it wakes for what it may have missed.

    A job due now whose `run_after` (or its transaction's start, which the NOTIFY names when
    earlier) lies below where a claimer's floor could be is posted to the qcluster's
    claimers (jobs/floor_hints.py), so their next scan starts below it (issue 36, point 1).
    """

    def __init__(self, *, workers: int, coalesce_seconds: float | None = None) -> None:
        self.workers = workers
        # Ping (look-ahead) interval, and how long a ping may wait for its answer: a peer
        # that vanished silently (NAT or load-balancer idle timeout, failover) is noticed
        # within twice this, and the connection replaced.
        self.ping_seconds = get_config().listener_ping_seconds
        # After a notification, notifications arriving this soon after are read in the same
        # round: one check for a burst instead of one per insert. With lingering drains
        # (JOBS_LINGER_SECONDS), two of their polls: a job a lingering drain takes within
        # its poll needs no wake task, and a wake task would end that drain's linger.
        if coalesce_seconds is None:
            config = get_config()
            coalesce_seconds = (
                min(2 * config.linger_poll_seconds, MAX_COALESCE_SECONDS)
                if config.linger_seconds
                else 0.05
            )
        self.coalesce_seconds = coalesce_seconds
        self.connection: psycopg.Connection | None = None
        self.connects = 0
        self.wakes_sent = 0
        self.checks = 0  # due checks made
        self.hints_posted = 0  # due times posted to the claimers (jobs/floor_hints.py)
        self._funcs: dict[int, str] = {}  # OrmQ id -> task function, see wake_tasks_in_broker
        self._timers: list[float] = []  # heap of due times, on this host's monotonic clock
        self._db_minus_monotonic: float | None = None  # database epoch - time.monotonic()
        self._next_check = 0.0  # monotonic time of the next ping and look-ahead
        self._check_at: float | None = None  # a timer's due check, after the drains' turn
        self._floor = ClaimFloor()  # the due check's, see _wake_if_due
        # Reconnects through an outage: one line, then a count per 30 s (I24).
        self._quiet = QuietLog(logger, "job wake-up listener")

    def run(self, should_stop: Callable[[], bool]) -> None:
        failures = 0
        while not should_stop():
            try:
                if self.connection is None or self.connection.closed:
                    self._connect()
                    self._look_ahead()
                    # What no NOTIFY told this connection: a job committed before it
                    # listened (while no qcluster ran, or this one was starting) or during
                    # an outage. A full check, below any floor; without it such a job
                    # waited for the minute schedule.
                    self._floor.forget()
                    self._wake_if_due()
                failures = 0
                if time.monotonic() >= self._next_check:
                    self._look_ahead()
                due_now = self._wait_for_notifications()
                if self._pop_timers():
                    linger_signal.nudge()
                    self._look_ahead()  # re-arm exactly at the next due time
                    # As after a NOTIFY (`coalesce_seconds`): a lingering drain nudged now
                    # takes the job within its poll and needs no wake task, which would end
                    # its linger; the check after that window sends one if the job still
                    # waits. A rate-limited kind's tokens pop a timer each (issue 38).
                    if self._check_at is None:
                        self._check_at = time.monotonic() + self._coalesce_now()
                if self._check_at is not None and time.monotonic() >= self._check_at:
                    self._check_at = None
                    due_now = True
                if due_now:
                    self._wake_if_due()
            except Exception as exc:  # noqa: BLE001 - the listener loop's one catch-all
                failures += 1
                delay = retry_delay(
                    failures, base=RECONNECT_BASE_SECONDS, cap=RECONNECT_CAP_SECONDS, jitter=0.25
                )
                self._quiet.failed(
                    exc,
                    "job wake-up listener: failed",
                    then=f"; reconnecting in {delay:.1f}s",
                    extra={"action": "jobs_listener_reconnect", "attempt": failures},
                )
                self.close()
                connections[DEFAULT_DB_ALIAS].close()  # the broker's may be gone too
                _sleep_unless(should_stop, delay)
        self.close()

    def _wake_if_due(self) -> bool:
        """Send a wake task if a job is due now and none is pending; True if sent.

        The check starts at this listener's floor (issue 32, point 1; jobs/claim_floor.py),
        as the runner's claim does: next to an old snapshot, the dead entries of the jobs
        claimed since cost it no heap visit. What it hears lowers that floor (a job committed
        below it, `_heard_due`). After a floored check a timer brings a full one once its
        floor's period (`ClaimFloor.period()`) has passed, found it a due job or not: a row
        no NOTIFY told of (one skipped while another transaction held its lock) still wakes
        a worker after the traffic stopped. A due job the check found below where the
        claimers' floors may be is posted to them, as a NOTIFY's is (issue 36, point 1).
        """
        assert self.connection is not None
        self.checks += 1
        floor = self._floor.bound()
        # bounded, like every query on this connection
        sent = time.monotonic()
        scanned_at, first_due = self._ping(due_now_sql(floor))
        if scanned_at is not None:  # the database's clock, re-read as the look-ahead does
            self._read_clock(scanned_at)
        seen = first_due if first_due is not None else scanned_at
        self._floor.saw(
            bound=floor,
            seen=None if seen is None else _from_epoch(seen),
            took=time.monotonic() - sent,
        )
        if floor is not None:
            at = time.monotonic() + self._floor.seconds_to_full_scan()
            if not (self._timers and self._timers[0] <= at):
                heapq.heappush(self._timers, at)
        if first_due is None:
            return False
        self._post_if_below_floors(float(first_due))
        sent = request_wake(workers=self.workers, funcs=self._funcs)
        self.wakes_sent += sent
        return sent

    def _heard_due(self, due_epoch: float) -> None:
        """A NOTIFY said a job due now committed at or above `due_epoch`: this listener's
        check starts at or below it, and so do the claimers' next scans when it is below
        where their floors may be."""
        self._floor.lower(_from_epoch(due_epoch))
        self._post_if_below_floors(due_epoch)

    def _post_if_below_floors(self, due_epoch: float) -> None:
        """Post `due_epoch` to the qcluster's claimers (jobs/floor_hints.py) unless it lies
        above every floor they may hold: a floor is at most the clock of the scan that set
        it, less JOBS_CLAIM_FLOOR_MARGIN_SECONDS, and every scan that set one began before
        now; a scan after the commit sees the job."""
        if self._db_minus_monotonic is not None:
            db_now = time.monotonic() + self._db_minus_monotonic
            line = db_now - get_config().claim_floor_margin_seconds
            if due_epoch >= line + HINT_SLACK_SECONDS:
                return
        self.hints_posted += 1
        floor_hints.post(due_epoch)

    def _look_ahead(self) -> None:
        """Ping, re-read the database's clock and arm a timer for the next job due soon."""
        assert self.connection is not None
        db_epoch, next_due = self._ping(LOOK_AHEAD_SQL)
        self._read_clock(db_epoch)
        self._next_check = time.monotonic() + self.ping_seconds
        if next_due is not None:
            self._arm(float(next_due))

    def _read_clock(self, db_epoch: bytes | None) -> None:
        """The database's clock as a statement just read it: what converts due times to
        this host's monotonic clock (a round trip late at most)."""
        self._db_minus_monotonic = float(db_epoch) - time.monotonic()

    def _ping(self, sql: str) -> list[bytes | None]:
        """Run a one-row query, waiting at most `ping_seconds` for its answer; its values as
        text. A blocking execute would wait forever on a peer that silently stopped
        answering (the TCP keepalives of the far side may still be acknowledged by a
        proxy), so this goes through libpq's asynchronous calls with a deadline."""
        assert self.connection is not None
        pgconn = self.connection.pgconn
        deadline = time.monotonic() + self.ping_seconds
        pgconn.send_query(sql.encode())
        while pgconn.flush():
            _wait_socket(pgconn.socket, deadline, write=True)
        row: list[bytes | None] = []
        while True:
            while pgconn.is_busy():
                _wait_socket(pgconn.socket, deadline)
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                # A NOTIFY that came in with the answer sits in libpq's queue, where
                # `notifies()` does not look (it waits for the socket): hand it to psycopg's
                # backlog, which `notifies()` yields first.
                while (notification := pgconn.notifies()) is not None:
                    if pgconn.notify_handler is not None:
                        pgconn.notify_handler(notification)
                return row
            if result.status not in (
                psycopg.pq.ExecStatus.TUPLES_OK,
                psycopg.pq.ExecStatus.COMMAND_OK,
            ):
                raise psycopg.OperationalError(
                    (result.error_message or b"ping failed").decode(errors="replace")
                )
            if result.ntuples:
                row = [result.get_value(0, column) for column in range(result.nfields)]

    def _arm(self, due_epoch: float) -> None:
        """Keep a timer for a due time (database epoch seconds)."""
        assert self._db_minus_monotonic is not None
        at = due_epoch - self._db_minus_monotonic + TIMER_MARGIN_SECONDS
        if at in self._timers:
            return
        if len(self._timers) >= MAX_TIMERS:  # keep the earliest; the look-ahead finds the rest
            if at >= max(self._timers):
                return
            self._timers.remove(max(self._timers))
            heapq.heapify(self._timers)
        heapq.heappush(self._timers, at)

    def _pop_timers(self) -> bool:
        """Drop the timers whose time came; True if any did."""
        now = time.monotonic()
        popped = False
        while self._timers and self._timers[0] <= now:
            heapq.heappop(self._timers)
            popped = True
        return popped

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            finally:
                self.connection = None

    def _connect(self) -> None:
        """A direct connection: LISTEN_DATABASE_URL when set (behind PgBouncer in transaction
        pooling, LISTEN must bypass the pooler), else the default database's parameters."""
        url = get_config().listen_database_url
        if url:
            params: dict = {"conninfo": url}
        else:
            params = connections[DEFAULT_DB_ALIAS].get_connection_params()
            for django_only in ("cursor_factory", "context", "prepare_threshold"):
                params.pop(django_only, None)
        params.setdefault("connect_timeout", 10)
        for option, value in KEEPALIVES.items():
            params.setdefault(option, value)
        self.connection = psycopg.connect(
            **params, autocommit=True, application_name="jobs-wake-listener"
        )
        self._ping(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        self._ping(f"LISTEN {CHANNEL}")
        self.connects += 1
        if self._quiet.recovered(
            f"connected again (LISTEN {CHANNEL})", action="jobs_listener_connected"
        ):
            return  # the outage's one closing line
        logger.info(
            "job wake-up listener connected (LISTEN %s)",
            CHANNEL,
            extra={"action": "jobs_listener_connected", "attempt": self.connects},
        )

    def _wait_for_notifications(self) -> bool:
        """Block until a notification, the next timer or WAIT_SECONDS; read a burst as one
        round; arm a timer for each due time ahead. True if a job may be due now."""
        assert self.connection is not None
        timeout = WAIT_SECONDS
        for at in (self._timers[0] if self._timers else None, self._check_at):
            if at is not None:
                timeout = max(0.0, min(timeout, at - time.monotonic()))
        first = [n.payload for n in self.connection.notifies(timeout=timeout, stop_after=1)]
        if not first:
            return False
        # Each notification is read as it comes: a job committed below the claimers' floors
        # is posted to them before the nudge, so the lingering drain it wakes scans below it.
        due_now = self._heard(first[0])
        if not due_now:
            # Due later: a timer is armed, nothing to coalesce (reading a burst now would
            # hold the timers back: a rate's next token is due within its interval).
            return False
        linger_signal.nudge()  # a lingering drain reads the claim index now, not at its poll
        # Read whatever else arrives in the next moments: one decision for a burst; each
        # notification still nudges the lingering drains (linger_signal rate-limits it).
        # With no drain running (the cluster idle past its lingers) nobody would take the
        # job within that window: check at once (issue 37, point 1).
        for notification in self.connection.notifies(timeout=self._coalesce_now()):
            due_now = self._heard(notification.payload) or due_now
            linger_signal.nudge()
        return due_now

    def _coalesce_now(self) -> float:
        """How long to read a burst before the due check: the coalescing window while a
        drain of this cluster runs (it may take the job itself), else none."""
        return self.coalesce_seconds if linger_signal.drains_running() else 0.0

    def _heard(self, payload: str) -> bool:
        """One notification: True if a job may be due now. A due time ahead arms a timer;
        a job due now lowers the floors to its `run_after` (or its transaction's start,
        migration 0016) when it lies below them (`_heard_due`)."""
        read = read_payload(payload)
        if read is None:  # not our trigger's (another role may NOTIFY): check now
            return True
        said_due_now, due_epoch = read
        if said_due_now:
            # The trigger said so on the database's clock (migration 0029): no estimate of
            # that clock decides it, so a step of it (NTP, a resumed VM) delays nothing.
            self._heard_due(due_epoch)
            return True
        if (
            self._db_minus_monotonic is None
            or due_epoch - self._db_minus_monotonic <= time.monotonic()
        ):
            self._heard_due(due_epoch)
            return True
        self._arm(due_epoch)
        return False


def read_payload(payload: str) -> tuple[bool, float] | None:
    """A notification of our triggers: (said due now, due epoch), or None if it is not one.
    `now <epoch>`: due now on the database's clock (migration 0029); `<epoch>`: a due time,
    later or (from the previous release's trigger) now."""
    prefix, _, epoch = payload.rpartition(" ")
    if prefix not in ("", DUE_NOW):
        return None
    try:
        due_epoch = float(epoch)
    except ValueError:
        return None
    if not math.isfinite(due_epoch):
        return None
    return prefix == DUE_NOW, due_epoch


def _from_epoch(value: bytes) -> datetime:
    return datetime.fromtimestamp(float(value), tz=UTC)


def _wait_socket(fileno: int, deadline: float, *, write: bool = False) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the wake-up listener's ping got no answer in time")
    readers, writers = ([], [fileno]) if write else ([fileno], [])
    if not any(select.select(readers, writers, [], left)):
        raise TimeoutError("the wake-up listener's ping got no answer in time")


def _sleep_unless(should_stop: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not should_stop() and time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
