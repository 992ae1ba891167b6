"""The per-kind table of the health page (issue 20): queued and running now; completed,
failed, p95 duration and p95 queue wait over the last 24 hours, from the trigger-kept 30-minute
rows (ops.models.JobPeriod), whichever code path or producer moved the job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from jobs import enqueue, run_pending
from jobs.models import Job
from jobs.selectors import job_counts_by_kind
from ops.charts import bucket_floor
from ops.durations import humanize_seconds
from ops.job_periods import (
    DURATION_BOUNDS,
    PERIOD,
    WAIT_BOUNDS,
    job_periods_prune,
    kind_table,
    p95_bound,
    p95_words,
)
from ops.models import JobPeriod

pytestmark = pytest.mark.django_db

HEALTH_URL = "/admin/worker-health/"


def _attempt(kind: str, *, wait: float, took: float, end: str = "completed") -> Job:
    """A job claimed `wait` s after it was due and ended `took` s later, as the runner's
    statements move it (plain UPDATEs: the triggers see what any producer would do)."""
    now = timezone.now()
    due = now - timedelta(seconds=wait + took)  # a retry ends now (no end time is kept)
    started = due + timedelta(seconds=wait)
    ended = started + timedelta(seconds=took)
    job = Job.objects.create(kind=kind, max_attempts=5, run_after=due)
    Job.objects.filter(pk=job.pk).update(
        status="processing", attempts=1, started_at=started, locked_by="h:1:a",
        lease_expires_at=now + timedelta(minutes=2),
    )  # fmt: skip
    done = {"completed": {"completed_at": ended}, "failed": {"failed_at": ended}}.get(end, {})
    Job.objects.filter(pk=job.pk).update(status="queued" if end == "retried" else end, **done)
    return job


def _table():
    return {
        row.kind: row
        for row in kind_table(now=timezone.now(), counts_by_kind=job_counts_by_kind()).rows
    }


def test_p95_is_the_upper_bound_of_the_bucket_holding_it():
    bounds = (1, 5, 10)
    assert p95_bound([0, 0, 0, 0], bounds) is None
    assert p95_bound([19, 1, 0, 0], bounds) == 1  # rank 19 of 20: the first bucket
    assert p95_bound([18, 2, 0, 0], bounds) == 5
    assert p95_words([0, 0, 0, 3], bounds) == "> 10 s"
    assert p95_words([0, 0, 0, 0], bounds) == "—"


def test_each_kind_counts_24_hours_and_reads_p95_duration_and_wait():
    for _ in range(19):
        _attempt("report.render", wait=10, took=0.3)
    _attempt("report.render", wait=4000, took=40)  # the slowest 5 %: past the p95
    _attempt("mail.relay", wait=0.2, took=2, end="failed")
    _attempt("mail.relay", wait=0.2, took=2, end="retried")
    Job.objects.create(kind="mail.relay", max_attempts=5)  # queued now
    JobPeriod.objects.create(  # a period past the window is not summed
        start=timezone.now() - timedelta(hours=30), kind="report.render", shard=0, completed=99,
        durations=[0] * (len(DURATION_BOUNDS) + 1), waits=[0] * (len(WAIT_BOUNDS) + 1),
    )  # fmt: skip

    table = _table()

    report, relay = table["report.render"], table["mail.relay"]
    assert (report.queued, report.running, report.completed, report.failed) == (0, 0, 20, 0)
    assert (report.p95_duration, report.p95_wait) == ("≤ 0.5 s", "≤ 15 s")
    assert (relay.queued, relay.completed, relay.failed, relay.retried) == (2, 0, 1, 1)
    assert relay.p95_duration == "≤ 2.5 s"  # the failed and the retried attempt both count


def test_the_runner_fills_the_table_and_a_released_claim_is_no_attempt():
    get_user_model().objects.create(username="alice")
    enqueue("demo.greet", {"username": "alice"})
    enqueue("demo.duplicate_user", {"username": "alice"}, max_attempts=1)
    assert run_pending().claimed == 2
    released = enqueue("demo.greet", {"username": "alice"})
    with connection.cursor() as cursor:  # claimed, then given back unstarted (job_release)
        cursor.execute(
            "UPDATE jobs_job SET status='processing', attempts=1, started_at=now(), "
            "locked_by='h:1:a', lease_expires_at=now() + interval '1 minute' WHERE id=%s",
            [released.pk],
        )
        cursor.execute(
            "UPDATE jobs_job SET status='queued', attempts=0, locked_by='', "
            "lease_expires_at=NULL WHERE id=%s",
            [released.pk],
        )

    table = _table()

    assert (table["demo.greet"].completed, table["demo.greet"].queued) == (1, 1)
    assert table["demo.greet"].retried == 0  # the released claim: neither retried nor failed
    assert (table["demo.duplicate_user"].failed, table["demo.duplicate_user"].completed) == (1, 0)
    assert table["demo.greet"].p95_wait != "—"


def test_old_periods_are_pruned():
    now = timezone.now()
    for days in (9, 1):
        JobPeriod.objects.create(start=now - timedelta(days=days), kind="k", shard=0)
    assert job_periods_prune(now=now) == 1
    assert JobPeriod.objects.count() == 1


def test_the_health_page_shows_the_table(admin_client):
    for _ in range(3):
        _attempt("report.render", wait=10, took=0.3)
    _attempt("report.render", wait=10, took=0.3, end="failed")
    Job.objects.create(kind="report.render", max_attempts=5)
    page = admin_client.get(HEALTH_URL).content.decode()
    table = page[page.index('<table class="kinds" id="kinds">') :].split("</table>")[0]
    row = table[table.index("<td>report.render</td>") :].split("</tr>")[0]
    cells = [c.split(">", 1)[1] for c in row.split("<td")[1:]]
    texts = [c.split("<", 1)[0] for c in cells]
    assert texts == ["report.render", "1", "0", "3", "1", "≤ 0.5 s", "≤ 15 s"]


def test_a_value_on_a_bound_counts_in_that_bucket():
    """le semantics, as /metrics' histograms: 0.5 s lands in "≤ 0.5 s", 1 s in "≤ 1 s"."""
    _attempt("edge.kind", wait=1, took=0.5)
    edge = _table()["edge.kind"]
    assert (edge.p95_duration, edge.p95_wait) == ("≤ 0.5 s", "≤ 1 s")


def test_a_period_row_with_other_buckets_is_refused_not_misread():
    """A hand-edited (or another release's) row whose histograms have another number of
    buckets would misplace counts once summed bucket by bucket: refused, naming the kind."""
    _attempt("tests.noop", wait=0.2, took=0.2)
    JobPeriod.objects.create(
        start=timezone.now().replace(minute=0, second=0, microsecond=0),
        kind="tests.edited",
        shard=7,
        completed=1,
        durations=[1, 0, 0],
        waits=[0] * (len(WAIT_BOUNDS) + 1),
    )
    with pytest.raises(ValueError, match="'tests.edited'"):
        _table()


def test_the_table_sums_rolled_up_rows_and_pending_deltas_bucket_by_bucket():
    """Two kinds, rolled up and not: every bucket of both histograms adds up."""
    from ops.rollups import counters_roll_up

    _attempt("tests.noop", wait=0.2, took=0.07)  # wait bucket 2, duration bucket 2
    _attempt("tests.log", wait=20, took=3)  # wait bucket 7, duration bucket 7
    counters_roll_up()
    _attempt("tests.noop", wait=0.2, took=0.07)  # a delta, not rolled up
    table = _table()
    assert table["tests.noop"].completed == 2
    assert table["tests.noop"].durations == [0, 2] + [0] * (len(DURATION_BOUNDS) - 1)
    assert table["tests.noop"].waits == [0, 2] + [0] * (len(WAIT_BOUNDS) - 1)
    assert table["tests.log"].durations[6] == 1 and sum(table["tests.log"].durations) == 1
    assert table["tests.log"].waits[6] == 1 and sum(table["tests.log"].waits) == 1


@pytest.mark.parametrize("minutes", [0, 11, 29, 30, 41, 59])
def test_the_table_covers_the_whole_range_and_says_how_much_more(minutes):
    """Issue 36.8: the "last 1 h" table summed from the start of the period before the
    current one: at xx:11 it covered 41 min, and its label said 1 h. It sums every period
    that overlaps the range and its label gives the span it covers."""
    hour = bucket_floor(timezone.now(), timedelta(hours=1)) - timedelta(hours=2)
    now = hour + timedelta(minutes=minutes)

    def period(start, completed: int) -> None:
        JobPeriod.objects.create(
            start=start, kind="report.render", shard=0, completed=completed,
            durations=[0] * (len(DURATION_BOUNDS) + 1), waits=[0] * (len(WAIT_BOUNDS) + 1),
        )  # fmt: skip

    overlapping = bucket_floor(now - timedelta(hours=1), PERIOD)  # holds now - 1 h
    period(overlapping, 1)
    period(overlapping + PERIOD, 10)
    period(bucket_floor(now, PERIOD), 100)  # the current period
    period(overlapping - PERIOD, 1000)  # ended before the range began: not summed

    table = kind_table(now=now, counts_by_kind={}, window=timedelta(hours=1))

    assert [row.completed for row in table.rows] == [111]
    assert table.since == overlapping
    assert timedelta(hours=1) <= table.covers < timedelta(hours=1) + PERIOD
    assert table.span == humanize_seconds(timedelta(hours=1, minutes=minutes % 30))
