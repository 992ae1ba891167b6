"""A rate per kind for the whole deployment (issue 38, point 3): `@handler(kind, rate="20/s")`.

The rate is parsed and checked when the handler is registered (a bad one names the kind);
each worker writes its registry's rates to `jobs_kindrate` at start-up; the claim takes the
kind's token where it claims the job (one bucket row per limited kind, the send-rate
bucket's SQL), so a job held back by its rate stays queued without spending an attempt, an
unlimited kind's claim never writes the bucket, two claimers never both take one token, and
a token taken says (NOTIFY, and the look-ahead's due time) when the next one comes.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection
from django.utils import timezone

from jobs import handler
from jobs.due_check_sql import LOOK_AHEAD_SQL, due_now_sql
from jobs.kind_rates import Rate, kind_rates_line, kind_rates_sync, parse_rate
from jobs.models import Job, KindRate
from jobs.registry import kind_rates
from jobs.runner_step import job_claim_batch, job_runner_step
from jobs.wakeup import read_payload
from tests.jobs.handlers import RATED_HOURLY_KIND, RATED_KIND, RATED_RATE
from tests.support.wakeup import raw_connection

HOURLY = RATED_HOURLY_KIND  # "1/h": one token now, the next in an hour


@pytest.mark.parametrize(
    ("text", "count", "per"),
    [("20/s", 20, 1), ("20/sec", 20, 1), ("90/m", 90, 60), ("90/min", 90, 60), ("3/h", 3, 3600)],
)
def test_a_rate_is_a_count_per_second_minute_or_hour(text, count, per):
    rate = parse_rate(text, kind="tests.k")
    assert (rate.count, rate.per_seconds) == (count, per)
    assert rate.interval_seconds == per / count
    assert parse_rate(str(rate), kind="tests.k") == rate  # its canonical spelling parses back


@pytest.mark.parametrize(
    "bad", ["0/s", "-1/s", "abc", "1e9/s", "", "20", "20/d", "2.5/s", "1000000/s", 20, b"5/s"]
)
def test_a_bad_rate_is_refused_at_registration_naming_the_kind(bad):
    with pytest.raises(ImproperlyConfigured, match=r"'tests\.bad_rate'.*rate="):

        @handler("tests.bad_rate", rate=bad)
        def bad_rate(payload: dict) -> None:
            pass


def test_the_registry_knows_each_kinds_rate_and_only_limited_kinds():
    rates = kind_rates()
    assert str(rates[RATED_KIND]) == RATED_RATE
    assert rates[HOURLY] == Rate(count=1, per_seconds=3600)
    assert "tests.noop" not in rates


def _table() -> dict[str, str]:
    return dict(KindRate.objects.values_list("kind", "rate"))


@pytest.mark.django_db(transaction=True)
def test_the_start_up_sync_makes_the_table_what_the_code_says_and_logs_each_change(caplog):
    KindRate.objects.create(kind="tests.no_such_handler", rate="4/s", interval_seconds=0.25)
    KindRate.objects.create(kind=RATED_KIND, rate="9/m", interval_seconds=60 / 9)
    with caplog.at_level(logging.INFO, logger="jobs.kind_rates"):
        changes = kind_rates_sync()
    assert _table() == {kind: str(rate) for kind, rate in kind_rates().items()}
    assert KindRate.objects.get(kind=RATED_KIND).interval_seconds == pytest.approx(0.2)
    assert sorted(str(change) for change in changes) == sorted(
        [
            f"{RATED_KIND} {RATED_RATE} (was 9/m)",
            f"{HOURLY} 1/h (new)",
            "tests.no_such_handler removed (was 4/s)",
        ]
    )
    assert "job rates changed: " in caplog.text
    assert "changed: " in kind_rates_line(changes)
    caplog.clear()
    assert kind_rates_sync() == []  # a second start changes nothing
    assert "job rates changed" not in caplog.text
    assert kind_rates_line([]).endswith("(unchanged)")


def _queue(kind: str, n: int = 1, ago: str = "1 minute") -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT %s, '{}', 'queued', 0, 0, 3, now() - %s::interval + g * interval '1 ms', "
            "now(), '', '' FROM generate_series(1, %s) AS g RETURNING id",
            [kind, ago, n],
        )
        return sorted(row[0] for row in cursor.fetchall())


def _bucket(kind: str) -> tuple[str, str, object]:
    """The bucket row's versions (xmin: written; xmax: locked) and its next token time."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text, xmax::text, next_slot_at FROM jobs_kindrate WHERE kind = %s",
            [kind],
        )
        return cursor.fetchone()


def _kinds(step) -> list[str]:
    return sorted(job.kind for job in step.claimed)


@pytest.mark.django_db(transaction=True)
def test_a_limited_kind_gives_one_job_per_token_and_the_rest_wait_without_an_attempt():
    kind_rates_sync()
    hourly = _queue(HOURLY, 3)
    _queue("tests.noop", 2)
    first = job_runner_step(worker="w", claim=10)
    assert _kinds(first) == ["tests.noop", "tests.noop", HOURLY]
    assert [job.id for job in first.claimed if job.kind == HOURLY] == hourly[:1]
    assert not first.more_due  # what waits is the limited kind's, which nobody may take now

    _queue("tests.noop", 1)
    second = job_runner_step(worker="w", claim=10)
    assert _kinds(second) == ["tests.noop"]  # the other kind passes the waiting ones
    waiting = Job.objects.filter(id__in=hourly[1:])
    assert {(job.status, job.attempts) for job in waiting} == {("queued", 0)}
    assert job_claim_batch(worker="w", limit=10) == []  # the tools' claim honours it too

    # The next token is an interval after the one taken (less the bucket's small tolerance).
    with connection.cursor() as cursor:
        cursor.execute("SELECT next_slot_at - clock_timestamp() FROM jobs_kindrate WHERE kind = %s",
                       [HOURLY])  # fmt: skip
        (ahead,) = cursor.fetchone()
    assert timedelta(minutes=59) < ahead <= timedelta(hours=1)

    # When it comes, exactly one more job is taken, the next in order.
    KindRate.objects.filter(kind=HOURLY).update(next_slot_at=None)
    third = job_runner_step(worker="w", claim=10)
    assert [job.id for job in third.claimed] == hourly[1:2]
    KindRate.objects.filter(kind=HOURLY).update(next_slot_at=None)
    (batch,) = job_claim_batch(worker="w", limit=10)
    assert batch.id == hourly[2]


@pytest.mark.django_db(transaction=True)
def test_the_bucket_row_is_written_only_when_its_token_is_taken():
    kind_rates_sync()
    before = _bucket(HOURLY)
    _queue("tests.noop", 5)
    assert len(job_runner_step(worker="w", claim=10).claimed) == 5
    assert len(job_claim_batch(worker="w", limit=10)) == 0
    assert _bucket(HOURLY) == before  # unlimited claims: not written, not even locked

    _queue(HOURLY, 2)
    job_runner_step(worker="w", claim=10)
    taken = _bucket(HOURLY)
    assert taken[0] != before[0] and taken[2] is not None  # the one token taken
    _queue("tests.noop", 3)
    for _ in range(3):
        job_runner_step(worker="w", claim=10)
    assert _bucket(HOURLY) == taken  # no token: the kind is skipped, its row left alone


@pytest.mark.django_db(transaction=True)
def test_two_claimers_never_both_take_one_token_and_neither_waits_for_the_other():
    kind_rates_sync()
    _queue(HOURLY, 3)
    _queue("tests.noop", 1)
    first = raw_connection()
    second = raw_connection()
    second.execute("SET statement_timeout = '3s'")  # waiting on the first would be an error
    step = (
        "SELECT kind FROM jobs_runner_step_v5(%s, '{}', '{}', NULL, NULL, '{}', 10, 1000000, "
        "60, false, '{}', NULL, false) WHERE id IS NOT NULL"
    )
    try:
        with first.transaction():
            taken = [row[0] for row in first.execute(step, ["a"]).fetchall()]
            assert sorted(taken) == ["tests.noop", HOURLY]
            # The first holds the bucket (its claim not committed yet): the second skips it.
            started = time.monotonic()
            assert second.execute(step, ["b"]).fetchall() == []
            assert time.monotonic() - started < 2
        assert second.execute(step, ["b"]).fetchall() == []  # committed: no token till the next
    finally:
        first.close()
        second.close()
    assert Job.objects.filter(kind=HOURLY, status="processing").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_token_taken_says_when_the_next_comes_and_the_look_ahead_finds_it():
    kind_rates_sync()
    KindRate.objects.filter(kind=RATED_KIND).update(interval_seconds=2.0)  # a token each 2 s
    _queue(RATED_KIND, 3)
    listener = raw_connection()
    listener.execute("LISTEN jobs_job_due")
    try:
        (job,) = job_runner_step(worker="w", claim=10).claimed
        payloads = [read_payload(n.payload)[1] for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        listener.close()
    next_slot = KindRate.objects.get(kind=RATED_KIND).next_slot_at.timestamp()
    assert payloads and abs(payloads[0] - next_slot) < 0.001, (payloads, next_slot)

    with connection.cursor() as cursor:
        cursor.execute(due_now_sql(None))
        assert cursor.fetchone()[1] is None  # waiting for its token: not due now
        cursor.execute(LOOK_AHEAD_SQL)
        _now, due = cursor.fetchone()
    assert due is not None and abs(float(due) - next_slot) < 0.001  # the timer's time

    KindRate.objects.filter(kind=RATED_KIND).update(next_slot_at=None)
    with connection.cursor() as cursor:
        cursor.execute(due_now_sql(None))
        assert cursor.fetchone()[1] is not None  # its token is there: due now


@pytest.mark.django_db(transaction=True)
def test_the_bucket_refuses_a_rate_that_is_not_positive():
    with pytest.raises(IntegrityError, match="jobs_kindrate_interval_positive"):
        KindRate.objects.create(kind="tests.k", rate="0/s", interval_seconds=0)


@pytest.mark.django_db(transaction=True)
def test_a_token_there_since_before_the_floor_is_still_due_for_the_due_checks():
    """The kind's token came long ago and nobody took it (every slot was busy): its job and
    its token lie below the floor a due check starts at, and it is due all the same, as the
    claim (which scans the kind's lanes from its last token's job) would take it."""
    kind_rates_sync()
    _queue(HOURLY, 1, ago="1 hour")
    KindRate.objects.filter(kind=HOURLY).update(next_slot_at=timezone.now() - timedelta(minutes=10))
    floor = timezone.now() - timedelta(minutes=1)
    with connection.cursor() as cursor:
        cursor.execute(due_now_sql(floor))
        assert cursor.fetchone()[1] is not None
        cursor.execute(LOOK_AHEAD_SQL)
        assert cursor.fetchone()[1] is None  # due now is not ahead: no timer
    assert len(job_runner_step(worker="w", claim=5, floor=floor).claimed) == 1
