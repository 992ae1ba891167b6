"""Issue 32, point 2: no row updated per job (nor per mail, notification or relay).

While another session holds a snapshot for minutes, PostgreSQL can remove no dead row
version. A row that every job updates (a counter) then grows a chain of hundreds of
thousands of versions and every enqueue walks it. So the path of one job (enqueue, claim,
completion, failure, retry) and the mail, notification and relay outcomes may write new rows
and update their own row, never a row another job or mail writes too. A row's xmin changes
exactly when the row is updated (a new version); these tests compare every row's xmin
before and after the work.

The figures the triggers keep (counts, rates, histograms, per-kind periods) come from
append-only deltas; they stay exact before and after the rollup folds them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.models import Schedule
from model_bakery import baker

from inbound_email.models import InboundEmail, Reply
from jobs import enqueue, run_pending
from jobs.models import JobCount, JobCountDelta
from jobs.selectors import job_counts_by_kind, job_status_counts
from notifications.models import EmailNotification
from ops.job_periods import kind_table
from ops.models import JobPeriod, JobPeriodDelta, MetricDelta, MetricSeries
from ops.rates import read_series
from ops.rollups import counters_roll_up
from ops.schedules import ensure_schedules
from ops.task_guard import refusal_reason
from tests.jobs import handlers  # noqa: F401 - registers the tests.* job kinds
from tests.support.sessions import other_session

pytestmark = pytest.mark.django_db(transaction=True)

# Tables whose every row belongs to one job or one mail / notification / reply: updating
# its own row is that item's life cycle, not a shared counter.
PER_JOB = {"jobs_job", "jobs_jobattempt"}
PER_ITEM = PER_JOB | {
    "inbound_email_inboundemail",
    "inbound_email_reply",
    "notifications_emailnotification",
}


def _row_versions() -> dict[str, dict[int, str]]:
    """{table: {id: xmin}} for every table of the schema with an `id` column."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name FROM information_schema.columns AS c "
            "JOIN information_schema.tables AS t USING (table_schema, table_name) "
            "WHERE c.table_schema = current_schema() AND c.column_name = 'id' "
            "AND t.table_type = 'BASE TABLE' ORDER BY 1"
        )
        tables = [name for (name,) in cursor.fetchall()]
        versions = {}
        for table in tables:
            cursor.execute(f'SELECT id, xmin::text FROM "{table}"')
            versions[table] = dict(cursor.fetchall())
    return versions


def _rows_updated(before: dict, after: dict, *, own: set[str]) -> dict[str, int]:
    """Rows present before and after whose version changed, per table outside `own`."""
    updated = {}
    for table, rows in before.items():
        if table in own:
            continue
        now = after.get(table, {})
        changed = sum(1 for pk, xmin in rows.items() if pk in now and now[pk] != xmin)
        if changed:
            updated[table] = changed
    return updated


def _figures() -> dict:
    series = read_series()
    table = kind_table(now=timezone.now(), counts_by_kind=job_counts_by_kind())
    return {
        "status": job_status_counts(),
        "by_kind": job_counts_by_kind(),
        "series": {
            (metric, label): (s.count, round(s.sum, 6), tuple(s.buckets))
            for metric, labels in series.items()
            for label, s in labels.items()
        },
        "periods": {
            row.kind: (row.completed, row.failed, row.retried, row.durations, row.waits)
            for row in table.rows
        },
    }


def test_enqueue_claim_completion_failure_and_retry_update_no_row_another_job_writes(
    settings,
):
    settings.JOBS_BACKOFF_BASE_SECONDS = 0
    settings.JOBS_BACKOFF_MAX_SECONDS = 0
    # One job of each kind first, so every counter row the triggers keep exists already.
    for kind in ("tests.noop", "tests.permanent", "tests.boom"):
        enqueue(kind, {}, max_attempts=2)
    run_pending()
    run_pending()  # the retried boom
    before = _row_versions()

    for n in range(20):
        enqueue("tests.noop", {"n": n})
    for n in range(3):
        enqueue("tests.permanent", {"n": n})
    enqueue("tests.boom", {}, max_attempts=2)
    run_pending()
    run_pending()

    assert _rows_updated(before, _row_versions(), own=PER_JOB) == {}
    figures = _figures()
    assert figures["status"]["completed"] == 21
    assert figures["status"]["failed"] == 4 + 2
    assert figures["by_kind"]["tests.boom"] == {"failed": 2}
    assert figures["series"][("jobs_completed", "tests.noop")][0] == 21
    assert figures["series"][("jobs_failed", "tests.boom")][0] == 2
    assert figures["series"][("job_duration_seconds", "tests.noop")][0] == 21
    assert figures["periods"]["tests.noop"][0] == 21
    assert figures["periods"]["tests.boom"][1:3] == (2, 2)
    assert figures["periods"]["tests.permanent"][1] == 4

    # The rollup folds the deltas: the figures do not move.
    assert counters_roll_up() > 0
    assert _figures() == figures
    assert counters_roll_up() == 0


def test_mail_notification_and_relay_outcomes_update_no_shared_row():
    def outcomes(n: int) -> None:
        mail = baker.make(
            InboundEmail, store_key=f"inbound/{n}", status=InboundEmail.Status.RECEIVED
        )
        InboundEmail.objects.filter(pk=mail.pk).update(status=InboundEmail.Status.PROCESSED)
        note = baker.make(EmailNotification, kind="proposal_review", status="pending")
        EmailNotification.objects.filter(pk=note.pk).update(
            status="sent", ses_message_id=f"m-{n}", sent_at=timezone.now()
        )
        reply = baker.make(Reply, notification=note, inbound_email=mail, relay_status="pending")
        Reply.objects.filter(pk=reply.pk).update(relay_status="posted")

    outcomes(0)
    before = _row_versions()
    for n in range(1, 6):
        outcomes(n)

    assert _rows_updated(before, _row_versions(), own=PER_ITEM) == {}
    series = read_series()
    assert series["inbound_mail"]["processed"].count == 6
    assert series["notifications_sent"]["proposal_review"].count == 6
    assert series["instruction_relays"]["posted"].count == 6
    counters_roll_up()
    assert read_series()["inbound_mail"]["processed"].count == 6


def test_figures_of_the_previous_release_stay_and_deltas_add_to_them():
    """Rows the old triggers wrote (shards 0-15) are kept and summed with the new deltas
    (expand/contract: the deploy loses no count)."""
    start = timezone.now().replace(minute=0, second=0, microsecond=0)
    JobCount.objects.create(kind="tests.noop", status="completed", shard=7, n=100)
    MetricSeries.objects.create(metric="jobs_completed", label="tests.noop", shard=7, count=100)
    JobPeriod.objects.create(
        start=start, kind="tests.noop", shard=3, completed=100, durations=[0] * 13, waits=[0] * 12
    )
    enqueue("tests.noop", {}, run_after=timezone.now() - timedelta(seconds=1))
    run_pending()
    counts, series = job_status_counts(), read_series()
    assert counts["completed"] == 101
    assert series["jobs_completed"]["tests.noop"].count == 101
    counters_roll_up()
    assert job_status_counts()["completed"] == 101
    assert read_series()["jobs_completed"]["tests.noop"].count == 101
    assert sum(JobPeriod.objects.values_list("completed", flat=True)) == 101


def test_a_job_committed_while_a_rollup_runs_is_counted_once():
    """The rollup moves only the deltas its snapshot sees; one committed after it waits for
    the next rollup, counted meanwhile from the deltas."""
    producer = other_session(application_name="web-app")
    try:
        producer.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) VALUES "
            "('tests.noop', '{}', 'queued', 0, 0, 1, now(), now(), '', '')"
        )
        enqueue("tests.noop", {})
        assert counters_roll_up() == 1  # the other producer's delta is not committed yet
        producer.commit()
    finally:
        producer.close()
    assert job_status_counts()["queued"] == 2
    assert counters_roll_up() == 1
    assert job_status_counts()["queued"] == 2


def test_the_previous_releases_functions_are_kept_for_its_running_code():
    """Expand/contract (I23): the old trigger functions stay until a later release; only the
    triggers moved to the new ones."""
    kept = {
        "jobs_count_add",
        "jobs_count_insert",
        "jobs_count_update",
        "jobs_count_delete",
        "jobs_count_truncate",
        "ops_metric_observe",
        "ops_metric_add",
        "ops_metric_job",
        "ops_job_period",
        "ops_job_statement",
        "ops_metric_mail",
        "ops_metric_notification",
        "ops_metric_relay",
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname = ANY(%s)", [list(kept)])
        assert {name for (name,) in cursor.fetchall()} == kept
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgfoid::regproc::text "
            "= ANY(%s)",
            [list(kept)],
        )
        assert cursor.fetchall() == []  # no trigger calls an old function any more
        cursor.execute("SELECT ops_metric_observe('jobs_completed', 'old.release', NULL, NULL)")
    assert read_series()["jobs_completed"]["other"].count == 1


def test_the_rollup_is_a_schedule_created_by_code_and_folds_every_delta():
    ensure_schedules()
    schedule = Schedule.objects.get(name="ops: roll up counters")
    assert (schedule.func, schedule.minutes, schedule.repeats) == (
        "ops.tasks.roll_up_counters",
        1,
        -1,
    )
    assert refusal_reason({"func": schedule.func}) is None  # the worker runs it
    enqueue("tests.noop", {})
    run_pending()
    before = _figures()
    assert import_string(schedule.func)() > 0
    assert not JobCountDelta.objects.exists()
    assert not MetricDelta.objects.exists() and not JobPeriodDelta.objects.exists()
    assert _figures() == before
