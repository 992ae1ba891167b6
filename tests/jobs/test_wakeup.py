"""The wake-up: the jobs_job trigger's NOTIFY, the listener that turns it into django-q2 wake
tasks, and a real qcluster starting jobs that any producer inserted."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from jobs import enqueue
from jobs.models import Job
from jobs.operator_actions import jobs_retry_now
from jobs.outcomes import job_record_failure
from jobs.runner_step import job_claim_batch
from jobs.wake_tasks import WAKE_TASK, request_wake, wake_tasks_in_broker
from jobs.wakeup import CHANNEL, WakeListener, read_payload
from project.db_clock import db_now
from tests.support.processes import (
    schedules_already_run,
    spawn_manage_py,
    stop_process_group,
)
from tests.support.tcp_proxy import SilencingProxy
from tests.support.wakeup import listening, plain_insert, raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


# --- the trigger --------------------------------------------------------------------------------


def test_one_notification_per_committed_transaction_none_before_commit_none_on_rollback():
    with listening() as received:
        with transaction.atomic():
            for _ in range(50):
                enqueue("tests.noop")
            assert received(0.3) == []  # not before commit
        assert received() == [CHANNEL]  # 50 rows, one transaction: one notification

        with pytest.raises(ZeroDivisionError), transaction.atomic():
            enqueue("tests.noop")
            raise ZeroDivisionError
        assert received(0.3) == []

        plain_insert("tests.noop")  # any producer, not only Django's enqueue()
        assert received() == [CHANNEL]


def test_rows_not_due_do_not_notify_until_an_update_makes_them_due():
    with listening() as received:
        job_id = plain_insert("tests.noop", delay="1 hour")
        assert received(0.3) == []  # the minute schedule starts it when due

        Job.objects.filter(pk=job_id).update(priority=5)  # still not due
        assert received(0.3) == []

        jobs_retry_now(jobs=Job.objects.filter(pk=job_id))  # run_after = now: due
        assert received() == [CHANNEL]

        Job.objects.filter(pk=job_id).update(priority=1)  # already due: nothing new
        assert received(0.3) == []


# --- the listener -------------------------------------------------------------------------------


@contextmanager
def _running_listener(workers: int) -> Iterator[WakeListener]:
    listener = WakeListener(workers=workers)
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


def _wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_burst_of_enqueues_leaves_one_pending_wake_task():
    with _running_listener(workers=2) as listener:
        for _ in range(200):
            enqueue("tests.noop")  # 200 transactions, 200 notifications
        _wait_for(lambda: wake_tasks_in_broker()[0] >= 1)
        time.sleep(1.0)  # let the listener read every notification
        assert wake_tasks_in_broker() == (1, 1)  # nobody consumes: still the one pending
        assert listener.wakes_sent == 1
    assert [row.func() for row in OrmQ.objects.all()] == [WAKE_TASK]


def test_a_task_row_that_cannot_be_decoded_does_not_stop_the_wake_up():
    """A row signed with another SECRET_KEY (or damaged) is not a wake task; wakes go on."""
    from django_q.brokers import get_broker

    OrmQ.objects.create(
        key=get_broker().list_key, payload="not-a-signed-package", lock=timezone.now()
    )
    assert wake_tasks_in_broker() == (0, 0)
    assert request_wake(workers=2) is True
    assert wake_tasks_in_broker() == (1, 1)
    assert request_wake(workers=2) is False  # one is pending


def test_a_wake_task_commits_without_the_wal_flush_and_the_session_keeps_it():
    """The wake task's commit is on the path of every wake-up; it skips the WAL flush (a
    lost wake task is one the minute's drain stands in for), for its own transaction only:
    the connection's next transactions (the listener's, a drain's) flush as before."""
    from django.db import connection

    seen: list[tuple[str, str]] = []

    def watch(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "django_q_ormq" in sql.lower() and sql.lstrip().upper().startswith("INSERT"):
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                seen.append(("insert", cursor.fetchone()[0]))
        return result

    with connection.execute_wrapper(watch):
        assert request_wake(workers=2) is True
    assert seen == [("insert", "off")]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def _woken_after(due) -> float:
    """Seconds from `due` (a database time) until a wake task is pending, on the database's
    clock; fails if none comes within 8 s."""
    _wait_for(lambda: wake_tasks_in_broker()[1] >= 1, 8)
    return (db_now() - due).total_seconds()


def _failed_attempt_due_in(seconds: float, settings) -> datetime:
    """A claimed job whose attempt fails: the retry's backoff makes it due in `seconds`."""
    settings.JOBS_BACKOFF_BASE_SECONDS = seconds
    settings.JOBS_BACKOFF_JITTER = 0
    enqueue("tests.noop")
    [claimed] = job_claim_batch(worker="w", limit=1)
    assert job_record_failure(job=claimed, worker="w", exc=RuntimeError("x")) == "retried"
    return Job.objects.get(pk=claimed.id).run_after


def test_a_job_due_in_two_seconds_is_woken_at_its_due_time_however_it_was_inserted(settings):
    """Issue 22: a job due in the next minute is started at its run_after, not at the
    minute tick: by plain SQL, by enqueue() and by a retry's backoff; never before it is due
    (a drain then would find nothing)."""
    inserts = {
        "plain SQL": lambda: (
            Job.objects.get(pk=plain_insert("tests.noop", delay="2 seconds")).run_after
        ),
        "enqueue()": lambda: (
            enqueue("tests.noop", run_after=db_now() + timedelta(seconds=2)).run_after
        ),
        "retry backoff": lambda: _failed_attempt_due_in(2, settings),
    }
    with _running_listener(workers=2):
        for how, insert in inserts.items():
            OrmQ.objects.all().delete()
            due = insert()
            late = _woken_after(due)
            assert 0 <= late <= 0.5, f"{how}: woken {late:.2f}s after run_after"
            Job.objects.filter(status=Job.Status.QUEUED).update(status=Job.Status.CANCELLED)


def test_a_job_due_now_is_woken_at_once_after_the_database_clock_stepped_ahead(settings):
    """Issue 36 point 1 (every committed due job within a second): the listener decided
    "due now" by comparing the notification's due time with its own estimate of the
    database's clock (its monotonic clock plus an offset read at its last ping, every
    JOBS_LISTENER_PING_SECONDS). After the clock stepped forward (an NTP step, a resumed VM),
    a job due now looked due later by the step, got a timer, and waited up to the next ping:
    16.5 s, seen once on a 2-core VM whose wall clock moved 2–5 ms/s against its monotonic
    one. The trigger now says itself that a job is due now. Here the listener's estimate is
    put 16 s behind, as such a step leaves it, and its pings are an hour apart."""
    settings.JOBS_LISTENER_PING_SECONDS = 3600
    with _running_listener(workers=2) as listener:
        _wait_for(lambda: listener._db_minus_monotonic is not None)
        listener._db_minus_monotonic -= 16.0  # the database's clock stepped 16 s ahead
        due = Job.objects.get(pk=plain_insert("tests.noop")).run_after
        late = _woken_after(due)
        assert late <= 1.0, f"woken {late:.2f}s after the commit"


@pytest.mark.parametrize(
    ("payload", "read"),
    [
        ("now 1796649245.5", (True, 1796649245.5)),
        ("1796649245.5", (False, 1796649245.5)),  # due later, or the previous trigger's
        ("", None),  # migration 0002's due-now payload, or another role's
        ("nan", None),
        ("now inf", None),
        ("-inf", None),
        ("soon 1796649245.5", None),
        ("now  1796649245.5", None),
        ("now", None),
    ],
)
def test_a_payload_that_is_not_our_triggers_is_read_as_none_meaning_check_now(payload, read):
    """Any role that can connect can NOTIFY on the channel: what is not `now <epoch>` or a
    finite `<epoch>` is not ours, and the listener checks at once rather than arming a
    timer for a time it cannot trust (`nan` and `inf` used to reach the timer heap)."""
    assert read_payload(payload) == read


def test_a_flood_of_notifications_from_another_role_queues_no_wake_task_when_nothing_is_due():
    """Issue 22: any role that can connect can NOTIFY; with no due job that must cost a few
    cheap checks (a burst is read as one round), never a wake task."""
    with _running_listener(workers=2) as listener, raw_connection() as other:
        for n in range(500):
            other.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{n}" if n % 2 else "x"])
        time.sleep(1.5)
        assert wake_tasks_in_broker() == (0, 0)
        assert listener.wakes_sent == 0
        assert listener.checks <= 25, listener.checks


def test_a_listener_whose_peer_silently_vanished_is_replaced_and_starts_what_came_meanwhile(
    settings,
):
    """Issue 22: the LISTEN connection goes through a proxy that silently stops forwarding
    (a NAT or load-balancer idle timeout). The listener's ping notices, the connection is
    replaced, and a job inserted during the outage gets its wake task well within 60 s of
    the stop (the ping interval is 1 s here, 15 s by default)."""
    db = connections["default"].settings_dict
    settings.JOBS_LISTENER_PING_SECONDS = 1
    with SilencingProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)) as proxy:
        settings.LISTEN_DATABASE_URL = (
            f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
        )
        with _running_listener(workers=2) as listener:
            proxy.go_silent()
            stopped = time.monotonic()
            plain_insert("tests.noop")  # its notification goes nowhere
            _wait_for(lambda: wake_tasks_in_broker()[1] >= 1, 60)
            woken = time.monotonic() - stopped
            assert listener.connects >= 2 and proxy.connections >= 2
            print(f"wake task {woken:.1f}s after the proxy stopped forwarding")
            assert woken < 10


_SILENT_INSERT = """
INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, run_after,
                      created_at, locked_by, last_error)
VALUES ('tests.noop', '{}', 'queued', 0, 0, 3, now(), now(), '', '')
"""


def test_the_listener_reconnects_after_losing_its_connection_and_wakes_for_what_it_missed():
    with _running_listener(workers=2) as listener:
        # Its kind's lane (jobs/lanes.py), which the trigger writes with a row: the session
        # below turns the triggers off to lose the notification, and would lose that too.
        plain_insert("tests.noop", delay="1 hour")
        with raw_connection() as admin:
            # A due job whose notification is lost (triggers off for this session).
            admin.execute("SET session_replication_role = replica")
            admin.execute(_SILENT_INSERT)
            time.sleep(0.5)
            assert wake_tasks_in_broker() == (0, 0)
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'jobs-wake-listener' AND datname = current_database()"
            ).fetchall()
        assert killed == [(True,)]
        _wait_for(lambda: listener.connects == 2)
        _wait_for(lambda: wake_tasks_in_broker() == (1, 1))  # the catch-up wake-up
        OrmQ.objects.all().delete()
        Job.objects.update(status=Job.Status.CANCELLED)

        plain_insert("tests.noop")  # heard on the new connection
        _wait_for(lambda: wake_tasks_in_broker() == (1, 1))


def test_a_job_committed_before_the_listener_listened_gets_a_wake_task_at_its_first_connect():
    # Its NOTIFY went to nobody: committed while no qcluster ran, or while one was starting,
    # between its process registering and its LISTEN (a CI run's qcluster started such a
    # job only at the minute schedule: 30 s of a test's wait and more).
    enqueue("tests.noop", {})
    assert wake_tasks_in_broker() == (0, 0)
    with _running_listener(workers=2) as listener:
        _wait_for(lambda: wake_tasks_in_broker() == (1, 1))
        assert listener.connects == 1


# --- a real qcluster ----------------------------------------------------------------------------


@contextmanager
def _qcluster(env: dict[str, str], log_path) -> Iterator[subprocess.Popen]:
    # The safety net must not be what starts the job: the minute schedules' next runs are an
    # hour away before the cluster starts (no start-up run of run_due_jobs to wait out).
    schedules_already_run()
    assert not Schedule.objects.filter(next_run__lte=timezone.now()).exists()
    with log_path.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while "jobs_job_due" not in log_path.read_text():  # the listener is up
            assert cluster.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield cluster
    finally:
        stop_process_group(cluster)


@pytest.mark.slow
def test_a_plain_sql_insert_is_started_by_a_running_qcluster_long_before_the_minute_tick(
    worker_env, tmp_path
):
    env = {**worker_env, "Q_WORKERS": "2", "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}
    log = tmp_path / "qcluster.log"
    with _qcluster(env, log):
        payload = '{"username": "from-the-web-app"}'
        job_id = plain_insert("tests.create_user", payload)
        inserted = time.monotonic()
        while Job.objects.get(pk=job_id).status != Job.Status.COMPLETED:
            assert time.monotonic() - inserted < 15, log.read_text()
            time.sleep(0.05)
        print(f"plain INSERT completed {time.monotonic() - inserted:.2f}s after commit")


@pytest.mark.slow
def test_a_job_enqueued_while_no_qcluster_ran_starts_when_one_starts_not_at_the_minute_tick(
    worker_env, tmp_path
):
    env = {**worker_env, "Q_WORKERS": "2", "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}
    log = tmp_path / "qcluster.log"
    job = enqueue("tests.create_user", {"username": "queued-during-a-deploy"})
    with _qcluster(env, log):
        listening = time.monotonic()
        while Job.objects.get(pk=job.pk).status != Job.Status.COMPLETED:
            assert time.monotonic() - listening < 15, log.read_text()
            time.sleep(0.05)


@pytest.mark.slow
def test_a_burst_of_enqueues_leaves_at_most_workers_plus_two_wake_tasks_in_the_broker(
    worker_env, tmp_path
):
    workers = 2
    env = {**worker_env, "Q_WORKERS": str(workers), "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}
    log = tmp_path / "qcluster.log"
    peak = 0
    sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        try:
            while sampling.is_set():
                peak = max(peak, wake_tasks_in_broker()[0])
                time.sleep(0.01)
        finally:
            connections.close_all()

    with _qcluster(env, log):
        sampling.set()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        ids = [enqueue("tests.noop").pk for _ in range(300)]
        deadline = time.monotonic() + 60
        while Job.objects.filter(pk__in=ids, status=Job.Status.COMPLETED).count() < len(ids):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        sampling.clear()
        sampler.join(timeout=10)
    print(f"peak wake tasks in the broker: {peak}")
    assert 1 <= peak <= workers + 2


def test_the_listen_connection_has_a_statement_timeout():
    """Issue 19.10: the connection lives as long as the qcluster; no statement hangs it."""
    listener = WakeListener(workers=1)
    listener._connect()
    try:
        assert listener.connection.execute("SHOW statement_timeout").fetchone()[0] == "10s"
    finally:
        listener.close()


def test_a_notification_that_arrives_during_a_ping_is_heard_at_once():
    """libpq reads a NOTIFY that comes in with a ping's answer (the look-ahead, the due
    check) into its own queue, where psycopg's `notifies()` did not look: it waited for the
    socket, so that job waited for the next notification of any kind or the next look-ahead
    (15 s). The first connect's due check, a second ping right after LISTEN, made it show:
    a CI run's job due a second later got no wake task."""
    listener = WakeListener(workers=2)
    try:
        listener._connect()
        listener._ping(f"SELECT pg_notify('{CHANNEL}', 'arrives with the answer')")
        started = time.monotonic()
        heard = listener._wait_for_notifications()
        assert heard, "the notification that came with the ping's answer was not read"
        assert time.monotonic() - started < 0.5
    finally:
        listener.close()
        connections.close_all()
