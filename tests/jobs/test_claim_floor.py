"""Issue 32, point 1: the runner's due scan skips the dead head of the claim index.

While another session holds a snapshot, every job claimed since leaves an entry in
jobs_job_claim_idx whose heap tuple is dead but not removable. The runner keeps a floor (a
`run_after` below which its last scans saw no live due row, jobs/claim_floor.py) and the
scan keeps `run_after >= floor` as an Index Cond: an entry below it is rejected on the index
tuple, never returned to the executor, so its heap tuple is not read. What a floor could
hide (a job given back with its old `run_after`, a back-dated INSERT, a row skipped while
locked) is found by the full scan every JOBS_CLAIM_FULL_SCAN_SECONDS: latency, never loss.

The count asserted is the claim indexes' `idx_tup_read` (pg_stat_user_indexes): the entries
the index handed to the executor, each a heap visit for the claim (jobs_job_lane_idx since
issue 36, which the claim reads by lane; jobs_job_claim_idx before).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.db import connection

from jobs import enqueue
from jobs.claim_floor import (
    FULL_SCAN_MAX_PERIOD_SECONDS,
    FULL_SCAN_SHARE,
    ClaimFloor,
    claim_floor,
)
from jobs.models import Job
from jobs.runner import run_pending
from jobs.runner_step import job_runner_step
from tests.support.processes import wait_until
from tests.support.sessions import other_session

Status = Job.Status

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = 2000  # jobs claimed while the snapshot is held: dead entries it keeps


def _insert_due(count: int, *, hours_ago: float, kind: str = "tests.noop") -> list[int]:
    """Queued jobs due `hours_ago`, by plain SQL (as another producer writes them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, '{}', 'queued', 0, 0, 3, "
            "now() - make_interval(secs => %s), now(), '', '' FROM generate_series(1, %s) "
            "RETURNING id",
            [kind, hours_ago * 3600, count],
        )
        return [row[0] for row in cursor.fetchall()]


def _claim_index_entries_read() -> int:
    """idx_tup_read of the claim indexes, with this session's own counts flushed first."""
    with connection.cursor() as cursor:
        # Flushed when this backend next goes idle, i.e. before the next statement.
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes "
            "WHERE indexrelname IN ('jobs_job_claim_idx', 'jobs_job_lane_idx')"
        )
        return cursor.fetchone()[0]


def test_next_to_an_old_snapshot_a_claim_reads_no_dead_entry_below_its_floor(settings):
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 3600  # only the first claim scans in full
    _insert_due(DEAD, hours_ago=1)
    with other_session(application_name="report") as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM jobs_job").fetchone()  # the snapshot is taken
        assert run_pending().completed == DEAD  # each leaves a dead, unremovable entry

        fresh = [enqueue("tests.noop", {}).id for _ in range(5)]
        before = _claim_index_entries_read()
        assert run_pending().completed == 5
        floored = _claim_index_entries_read() - before

        # The same drain with a full scan at every claim walks every dead entry: the count
        # sees them, and the floor is what kept the drain above off them.
        settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 0
        fresh += [enqueue("tests.noop", {}).id for _ in range(5)]
        before = _claim_index_entries_read()
        assert run_pending().completed == 5
        full = _claim_index_entries_read() - before
        report.rollback()
    assert Job.objects.filter(id__in=fresh, status=Status.COMPLETED).count() == 10
    assert full >= DEAD
    assert floored < 50  # the 5 new jobs' entries and those of the few claimed just before


def test_the_floor_is_an_index_cond_of_the_runners_scan_and_its_plan_is_made_once():
    """The plan of the claim inside jobs_runner_step_v5 (auto_explain, nested statements,
    sent to this client as a NOTICE): the floor is checked on the index entries of
    jobs_job_claim_idx, not after fetching the row; and after PL/pgSQL's first five calls
    the plan is the session's generic one, its floor a parameter, reused at every call.
    With both bounds on run_after values (jobs 0014), every call was planned anew (its
    Index Cond held the literal timestamps): 10-15 µs a job of server CPU (bench/jobs.py).
    Since issue 36 the scan is one range of jobs_job_lane_idx per lane (kind, priority), the
    clock its upper bound: another kind's rows are not read."""
    _insert_due(2000, hours_ago=1)
    _insert_due(2000, hours_ago=1, kind="tests.other")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    plans: list[str] = []
    with connection.cursor() as cursor:
        pg = cursor.connection
        pg.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_level = 'notice'",
            "SET client_min_messages = 'notice'",
        ):
            cursor.execute(setting)
    floor = _db_clock() - timedelta(hours=2)
    for _ in range(8):
        plans.clear()
        step = job_runner_step(worker="w", claim=5, floor=floor)
        assert len(step.claimed) == 5
    conds = [
        cond
        for plan in plans
        for cond in re.findall(r"using jobs_job_lane_idx on .*\n\s+Index Cond: (.*)", plan)
    ]
    assert conds, plans  # the due scan goes through the index
    # The lower bound is the floor, a parameter, or (issue 38) the lane's own, which is
    # the floor for every lane but a rate-limited kind's: a column of the lanes' row, never
    # a literal timestamp.
    lower = r"run_after >= (\$\d+|lanes(_\d+)?\.lower)"
    assert all(re.search(lower, cond) for cond in conds), conds
    assert all(re.search(r"kind\)::text = ", cond) for cond in conds), conds


def _db_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _floor_set_above(hours_ago: float) -> None:
    """A drain that claims a fresh job: this process's floor is now far above `hours_ago`."""
    enqueue("tests.noop", {})
    assert run_pending().completed == 1


def _drained_until_done(job_id: int) -> None:
    """Drain until `job_id` completed (no floor hides it longer than a full-scan period;
    the timeout only bounds the test)."""

    def done() -> bool:
        run_pending()
        return Job.objects.filter(id=job_id, status=Status.COMPLETED).exists()

    wait_until(done, f"job {job_id} claimed by a full scan", timeout=30, interval=0.2)


def test_a_job_given_back_with_its_old_run_after_is_still_claimed(settings):
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 1
    (old,) = _insert_due(1, hours_ago=1)
    other = job_runner_step(worker="other-worker", claim=1)  # another worker holds it
    assert [job.id for job in other.claimed] == [old]
    _floor_set_above(hours_ago=1)
    given_back = job_runner_step(worker="other-worker", release=[old])
    assert given_back.released == 1
    _drained_until_done(old)


def test_a_back_dated_insert_below_the_floor_is_still_claimed(settings):
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 1
    _floor_set_above(hours_ago=1)
    (old,) = _insert_due(1, hours_ago=1)
    _drained_until_done(old)


def test_a_job_skipped_while_locked_is_still_claimed(settings):
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 1
    (old,) = _insert_due(1, hours_ago=1)
    newer = enqueue("tests.noop", {}).id
    with other_session(application_name="admin edit") as admin:
        admin.execute("SELECT id FROM jobs_job WHERE id = %s FOR UPDATE", [old])
        assert run_pending().completed == 1  # the newer job; the locked one is skipped
        admin.rollback()
    assert Job.objects.get(id=newer).status == Status.COMPLETED
    assert Job.objects.get(id=old).status == Status.QUEUED
    _drained_until_done(old)


def test_a_back_dated_insert_below_the_listeners_floor_still_wakes_a_worker(settings):
    """The wake-up listener's due check starts at its own floor too: a check that finds
    nothing above it arms a timer for the next full one, so the NOTIFY of a job due below
    the floor still ends in a wake task."""
    from django_q.models import OrmQ

    from jobs.wake_tasks import wake_tasks_in_broker
    from tests.jobs.test_wakeup import _running_listener

    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 1
    with _running_listener(workers=2) as listener:
        fresh = enqueue("tests.noop", {})  # its NOTIFY: the check sets the floor near now
        wait_until(lambda: listener.wakes_sent >= 1, "the wake task for the fresh job")
        Job.objects.filter(id=fresh.id).update(status=Status.CANCELLED)
        OrmQ.objects.all().delete()
        sent = listener.wakes_sent
        _insert_due(1, hours_ago=1)  # its NOTIFY says "due now"; the row is below the floor
        wait_until(lambda: listener.wakes_sent > sent, "a wake task after a full check", 30)
    assert wake_tasks_in_broker()[0] >= 1


def test_a_slow_full_scan_puts_the_next_one_further_off(settings):
    """Next to an old snapshot the full scan walks every dead entry (~200 ms after 10
    minutes at 1,000 jobs/s): once a second in each worker and in the listener, that was a
    third of a 2-core machine. A full scan that took `t` seconds is followed by the next no
    sooner than t / FULL_SCAN_SHARE (20 t): at most a twentieth of the process's time."""
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 1
    now = _db_clock()

    slow = ClaimFloor()
    slow.saw(bound=None, seen=now, took=0.5)
    assert slow.bound() is not None  # the next scan starts at the floor, not in full
    assert 5 <= slow.seconds_to_full_scan() <= 0.5 / FULL_SCAN_SHARE

    fast = ClaimFloor()
    fast.saw(bound=None, seen=now, took=0.002)
    assert fast.seconds_to_full_scan() <= 1  # the setting's period, as without a snapshot

    stalled = ClaimFloor()  # a statement stalled for minutes (a lock, a slow commit)
    stalled.saw(bound=None, seen=now, took=600)
    assert stalled.period() == FULL_SCAN_MAX_PERIOD_SECONDS  # not 200 minutes

    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 0  # "every scan in full" still means that
    assert slow.bound() is None


def test_the_runner_tells_its_floor_how_long_a_full_scan_took(settings):
    """What sets the period: the runner's full scan next to a snapshot that keeps many dead
    entries."""
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 0.001  # the full scan's duration sets the period
    _insert_due(DEAD, hours_ago=1)
    with other_session(application_name="report") as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM jobs_job").fetchone()
        assert run_pending().completed == DEAD  # dead, unremovable entries
        claim_floor.forget()
        assert run_pending().completed == 0  # a full scan over the dead entries
        # Its duration, times twenty (any round trip takes more than the 50 µs that would
        # leave the setting's period).
        assert claim_floor.period() > 0.001
        report.rollback()


# --- issue 36, point 4: the floor's two guards, each held by a test that fails without it ---------


def test_a_full_scan_lowers_the_floor_to_what_it_saw():
    """A full scan sees every live due row: its floor is what it saw, even below the floor
    before it (a job given back, a back-dated INSERT). A full scan that only raised the floor
    would leave the rows between the two to the next full scan: a delay, which the drains'
    30 s waits above would hide."""
    now = _db_clock()
    margin = timedelta(seconds=1)  # JOBS_CLAIM_FLOOR_MARGIN_SECONDS' default
    floor = ClaimFloor()
    floor.saw(bound=None, seen=now)
    assert floor.current() == now - margin
    floor.saw(bound=None, seen=now - timedelta(hours=1))  # a full scan found an older row
    assert floor.current() == now - timedelta(hours=1) - margin
    floor.saw(bound=floor.current(), seen=now)  # a floored scan only raises it
    assert floor.current() == now - margin
    floor.saw(bound=floor.current(), seen=now - timedelta(hours=2))
    assert floor.current() == now - margin


def test_the_rows_a_full_scan_saw_below_the_floor_are_claimed_without_another_full_scan(settings):
    """The runner's own floor: a full scan that claims one of two old rows (a batch of one)
    lowers the floor to it, so the next claim, floored, takes the other at once. Full scans
    are then an hour apart: nothing else would find it."""
    settings.JOBS_CLAIM_BATCH_SIZE = 1
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 0  # every scan in full
    _floor_set_above(hours_ago=1)
    old = _insert_due(2, hours_ago=1)
    assert run_pending(limit=1).completed == 1  # a full scan: it saw the older row
    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 3600  # from here on, every scan floored
    assert claim_floor.bound() is not None
    assert run_pending().completed == 1
    assert Job.objects.filter(id__in=old, status=Status.COMPLETED).count() == 2


def test_the_floor_stays_the_margin_below_what_a_scan_saw(settings):
    """Rows committed a little out of `run_after` order (two producers; a give-back right
    after a claim) are found by the next claim, not the next full scan: the floor stays
    JOBS_CLAIM_FLOOR_MARGIN_SECONDS below the first row a scan saw."""
    settings.JOBS_CLAIM_FLOOR_MARGIN_SECONDS = 5
    now = _db_clock()
    floor = ClaimFloor()
    floor.saw(bound=None, seen=now)
    assert floor.current() == now - timedelta(seconds=5)
    floor.saw(bound=floor.current(), seen=now + timedelta(seconds=10))
    assert floor.current() == now + timedelta(seconds=5)

    settings.JOBS_CLAIM_FULL_SCAN_SECONDS = 3600  # only the first claim scans in full
    claim_floor.forget()
    assert run_pending().completed == 0  # a full scan: the floor is its clock, less 5 s
    (late,) = _insert_due(1, hours_ago=3 / 3600)  # committed now, due 3 s ago
    assert claim_floor.bound() is not None
    assert run_pending().completed == 1  # floored, and still found
    assert Job.objects.get(id=late).status == Status.COMPLETED
