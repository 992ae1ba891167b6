"""The Worker health page: staff only, worker_status's figures, and tiles whose links open the
admin changelist filtered to exactly the rows the tile counts."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail, Reply
from jobs.models import Job
from notifications.models import EmailNotification, SendingState
from ops.health import worker_health
from ops.ranges import RANGES
from processes.models import WorkerProcess
from tests.support.finished_jobs import finish_jobs
from tests.support.leases import live_lease_count, make_lease, spare_slots

pytestmark = pytest.mark.django_db

HEALTH_URL = "/admin/worker-health/"


@pytest.fixture
def rows() -> None:
    """At least one row for every tile, and decoys of the same model that a filter must skip."""
    now = timezone.now()

    def job(**fields):
        return baker.make(Job, kind="report.render", max_attempts=5, **fields)

    job(status="queued", run_after=now - timedelta(minutes=10))  # due, over the backlog alert
    job(status="queued", run_after=now + timedelta(hours=1))  # queued, not due
    job(status="processing", lease_expires_at=now - timedelta(minutes=1))  # stuck
    job(status="processing", lease_expires_at=now + timedelta(minutes=1))  # healthy
    finish_jobs(
        "report.render",
        [(now - timedelta(minutes=3), "completed"), (now - timedelta(minutes=2), "failed")],
    )
    job(status="cancelled", cancelled_at=now)

    def mail(key: str, status: str) -> InboundEmail:
        return baker.make(InboundEmail, store_key=key, status=status)

    for i, status in enumerate(InboundEmail.Status.values):
        mail(f"inbound/{i}", status)
    stuck_relay = mail("inbound/stuck-relay", "awaiting_relay")
    InboundEmail.objects.filter(pk=stuck_relay.pk).update(updated_at=now - timedelta(hours=25))

    notification = baker.make(EmailNotification, status="pending")
    for i, acknowledged_at in enumerate([None, now]):
        baker.make(
            Reply,
            notification=notification,
            inbound_email=mail(f"inbound/reply-{i}", "processed"),
            relay_status="inboxed",
            needs_operator=True,
            operator_acknowledged_at=acknowledged_at,
        )
    baker.make(EmailNotification, status="sending", claimed_at=now - timedelta(hours=2))
    baker.make(EmailNotification, status="sending", claimed_at=now)
    baker.make(EmailNotification, status="sent", sent_at=now, ses_message_id="m-1")

    def process(role: str, pid: int, beat_ago: timedelta, **fields) -> WorkerProcess:
        return baker.make(
            WorkerProcess,
            role=role,
            host="worker-1",
            pid=pid,
            version="0.1.0",
            started_at=now - timedelta(hours=3),
            heartbeat_at=now - beat_ago,
            interval_seconds=10,
            gone_after=now - beat_ago + timedelta(seconds=30),
            **fields,
        )

    process("run_jobs", 101, timedelta(seconds=5), current="job #7 report.render")  # live
    process("qcluster worker", 102, timedelta(seconds=40))  # silent for 4 beats: gone
    process("run_sweeps", 103, timedelta(minutes=5), stopped_at=now - timedelta(minutes=5))
    process("run_sweeps", 104, timedelta(hours=2), stopped_at=now - timedelta(hours=2))  # old
    baker.make(EmailNotification, status="expired", sent_at=now, ses_message_id="m-2")

    live, expired = spare_slots(2)
    make_lease(slot=live, now=now, live=True)
    make_lease(slot=expired, now=now, live=False)


def test_only_staff_see_the_page(client, django_user_model):
    response = client.get(HEALTH_URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]

    member = django_user_model.objects.create_user(username="member", password="pw")
    client.force_login(member)
    response = client.get(HEALTH_URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]

    staff = django_user_model.objects.create_user(username="staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(HEALTH_URL).status_code == 200


def test_the_admin_index_links_the_page(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert f'href="{HEALTH_URL}"' in html
    assert reverse("ops:worker_health") == HEALTH_URL


def test_every_tile_opens_a_changelist_with_exactly_the_rows_it_counts(admin_client, rows):
    page = admin_client.get(HEALTH_URL)
    assert page.status_code == 200
    tiles = [tile for section in page.context["health"].sections for tile in section.tiles]
    assert len(tiles) == 22
    for tile in tiles:
        assert tile.value > 0, f"the fixture leaves tile {tile.label!r} empty"
        assert f'href="{tile.url.replace("&", "&amp;")}"' in page.content.decode()
        listing = admin_client.get(tile.url)
        # An unknown filter parameter makes the admin redirect to ?e=1 instead of filtering.
        assert listing.status_code == 200, (tile.label, tile.url, listing.status_code)
        changelist = listing.context["cl"]
        assert changelist.result_count == tile.value, (tile.label, tile.url)
        # The fixture's decoys prove the link filters rather than listing the whole table.
        assert changelist.result_count < changelist.model.objects.count(), tile.label


def test_figures_and_alerts_match_worker_status(rows):
    health = worker_health()
    live_leases = live_lease_count(now=health.generated_at)
    by_label = {tile.label: tile for section in health.sections for tile in section.tiles}
    assert by_label["stuck past their lease"].value == 1
    assert by_label["stuck past their lease"].alert
    assert by_label["due now"].value == 1 and by_label["due now"].alert
    assert by_label["failed"].alert and not by_label["queued"].alert
    assert by_label["Quarantined"].value == 1 and by_label["Quarantined"].alert
    assert by_label["Awaiting relay (mail kept until posted)"].value == 2
    assert by_label["relays stuck over 24 h"].value == 1
    assert by_label["instructions needing an operator"].value == 1
    assert by_label["open: sending (claimed)"].value == 2
    assert by_label["stuck in sending"].value == 1
    assert by_label["held by a live writer"].value == live_leases >= 1
    assert len(health.status.needs_operator) == 7  # every worker_status exit reason


def test_the_page_lists_live_and_recently_gone_processes(admin_client, rows):
    """Issue 20: nothing showed which processes were alive. The page lists each live process
    with what it runs, and those gone (stopped or silent) within the last hour."""
    html = admin_client.get(HEALTH_URL).content.decode()
    table = html[
        html.index('<table class="processes"') : html.index(
            "</table>", html.index('<table class="processes"')
        )
    ]
    rows_html = table.split("<tr>")[2:]
    assert [r.split("</td>")[0].rsplit(">", 1)[1] for r in rows_html] == ["live", "gone", "stopped"]
    assert "worker-1:101" in rows_html[0] and "job #7 report.render" in rows_html[0]
    assert "worker-1:102" in rows_html[1] and "worker-1:103" in rows_html[2]
    assert "worker-1:104" not in table  # gone for over an hour
    by_label = {tile.label: tile for tile in worker_health().sections[0].tiles}
    assert by_label["live"].value == 1
    assert by_label["gone in the last hour"].value == 2
    assert by_label["gone in the last hour"].note == "1 fell silent (killed, host lost)"


def test_the_page_shows_every_time_iso_utc_with_seconds(admin_client):
    """Issue 31.6: the page mixed "2026-12-04T16:46:05", "2026-12-04T16:46" and "Thu 16:30";
    every time on it reads as the admin's do (project/formats): "2026-12-04 16:46:05 UTC"."""
    from jobs.models import PausedKind

    now = timezone.now().replace(microsecond=0)
    started = now - timedelta(minutes=5, seconds=7)
    baker.make(
        WorkerProcess,
        role="qcluster",
        host="h",
        pid=1,
        started_at=started,
        heartbeat_at=now,
        gone_after=now + timedelta(seconds=30),
        interval_seconds=10,
    )
    paused = PausedKind.objects.create(kind="report.render", paused_by="admin")
    lease = make_lease(slot=42, now=now - timedelta(seconds=3), live=True)
    html = admin_client.get(HEALTH_URL).content.decode()
    for moment in (started, paused.paused_at, lease.acquired_at, lease.expires_at):
        assert f"{moment:%Y-%m-%d %H:%M:%S} UTC" in html, moment
    shown = re.sub(r"<[^>]+>", " ", html)  # what a person reads (not data- attributes)
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", shown)


@pytest.mark.parametrize(
    ("key", "bars", "per"),
    [("1h", 60, "per minute"), ("24h", 48, "per 30 min"), ("7d", 56, "per 3 h")],
)
def test_each_range_draws_a_readable_number_of_bars_on_labelled_axes(admin_client, key, bars, per):
    """Issue 20: one range, one bucket size that fits it (never 1,440 one-minute hairlines),
    and a y axis that says what a bar counts."""
    jobs_chart, mail_chart = worker_health(chart_range=RANGES[key]).charts
    assert (jobs_chart.bars, mail_chart.bars) == (bars, bars)
    assert (jobs_chart.y_label, mail_chart.y_label) == (f"jobs {per}", f"mails {per}")

    page = admin_client.get(f"{HEALTH_URL}?range={key}").content.decode()
    assert f">jobs {per}</text>" in page and f">mails {per}</text>" in page
    assert page.count(">time (UTC)</text>") == 4  # two charts, each drawn wide and narrow
    assert 'preserveAspectRatio="none"' not in page  # text is never stretched
    selector = page[page.index('id="range-select"') :].split("</nav>")[0]
    assert selector.count("<a ") == 3
    current = selector.split('aria-current="page"')[0].rsplit("<a ", 1)[1]
    assert f"range={key}" in current


def test_the_ranges_count_what_they_cover(admin_client):
    now = timezone.now()
    ago = (timedelta(minutes=5), timedelta(hours=3), timedelta(days=3))
    finish_jobs("k", [(now - a, "completed") for a in ago])
    totals = {
        key: {s.name: s.total for s in worker_health(chart_range=r).charts[0].series}["completed"]
        for key, r in RANGES.items()
    }
    assert totals == {"1h": 1, "24h": 2, "7d": 3}


def test_the_per_kind_table_follows_the_range(admin_client):
    """Issue 31.6: the per-kind table stayed at 24 h when the page showed 1 h or 7 d."""
    now = timezone.now()
    ago = (timedelta(minutes=5), timedelta(hours=3), timedelta(days=3))
    finish_jobs("report.render", [(now - a, "completed") for a in ago])
    finish_jobs("report.render", [(now - timedelta(hours=5), "failed")])
    shown = {}
    for key, label in (("1h", "1 h"), ("24h", "24 h"), ("7d", "7 d")):
        response = admin_client.get(HEALTH_URL, {"range": key})
        page = response.content.decode()
        table = page.split('id="kinds"', 1)[1].split("</table>", 1)[0]
        assert '<th scope="col">completed</th><th scope="col">failed</th>' in table
        kinds = response.context["health"].kinds
        head = page.split('id="kinds-head">', 1)[1].split("</p>", 1)[0]
        assert head == (
            f"Per kind: now, and since {kinds.since:%Y-%m-%d %H:%M:%S} UTC ({kinds.span}: "
            f"the 30-minute periods that overlap the last {label})"
        )
        (row,) = kinds.rows
        shown[key] = (row.completed, row.failed)
    assert shown == {"1h": (1, 0), "24h": (2, 1), "7d": (3, 1)}


@pytest.mark.parametrize("value", ["5y", "<script>alert(1)</script>", "24h' OR 1=1"])
def test_an_unknown_range_shows_the_default_and_says_so(admin_client, value):
    """A hand-edited address is no server error: the page shows 24 h and names the value."""
    response = admin_client.get(HEALTH_URL, {"range": value})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="range-notice"' in page and "showing the last 24 h" in page
    assert "<script>alert(1)" not in page
    assert ">jobs per 30 min</text>" in page


def test_charts_count_the_last_24_hours(rows):
    jobs_chart, mail_chart = worker_health().charts
    totals = {s.name: s.total for s in jobs_chart.series}
    assert totals == {"completed": 1, "failed": 1}
    assert sum(s.total for s in mail_chart.series) == InboundEmail.objects.count()


def test_the_page_costs_a_fixed_number_of_queries_whatever_the_rows(
    admin_client, rows, django_assert_max_num_queries
):
    """No per-row query: tiles are GROUP BYs and counts, the charts two GROUP BYs each side."""
    admin_client.get(HEALTH_URL)  # warm the session / content types
    # The tiles and charts, and the parts issues 19, 20 and 23 added (refused tasks, unknown
    # and overdue schedules, processes, paused kinds, the sending pause, bounce rates,
    # issue 38's pruning runs: one fixed read, issue 37's caps per kind: one statement,
    # issue 38's rates per kind: one statement, and issue 37's timeouts and cancellations of
    # the last hour: one GROUP BY on JobStop's index); none per row (the second block checks
    # that more rows cost no more queries).
    with django_assert_max_num_queries(32) as first:
        admin_client.get(HEALTH_URL)
    baker.make(
        Job,
        kind="more.work",
        status="completed",
        max_attempts=5,
        completed_at=timezone.now(),
        _quantity=50,
    )
    baker.make(InboundEmail, status="processed", _quantity=20)
    with django_assert_max_num_queries(len(first.captured_queries)):
        admin_client.get(HEALTH_URL)


def test_the_page_shows_a_sending_pause(admin_client):
    """Issue 23: all sending paused for SES's daily quota shows, with its end and reason."""
    assert b'id="sending-paused"' not in admin_client.get(HEALTH_URL).content
    SendingState.objects.create(
        pk=1,
        paused_until=timezone.now() + timedelta(minutes=15),
        paused_at=timezone.now(),
        pause_reason="SES Throttling: Daily message quota exceeded.",
    )
    page = admin_client.get(HEALTH_URL).content.decode()
    assert 'id="sending-paused"' in page
    assert "Sending paused until" in page and "Daily message quota exceeded" in page


def test_the_page_shows_the_bounce_and_complaint_rates(admin_client):
    from notifications.suppression import feedback_record

    now = timezone.now()
    baker.make(EmailNotification, status="sent", sent_at=now, ses_message_id="m", _quantity=50)
    feedback_record(address="b@example.net", kind="hard_bounce", source="dsn", report="", now=now)
    page = admin_client.get(HEALTH_URL).content.decode()
    assert "50 mail(s) sent" in page
    assert "bounce rate <strong>2.0 %</strong>" in page
    assert "complaint rate <strong>0.0 %</strong>" in page
    assert "1 suppressed address(es)" in page


def test_quarantined_mail_shows_its_count_and_the_age_of_the_oldest():
    """Quarantined mail is never pruned: the page says how many wait, and since when."""
    now = timezone.now()
    for days in (3, 0):
        row = baker.make(InboundEmail, status="quarantined")
        InboundEmail.objects.filter(pk=row.pk).update(
            finished_at=now - timedelta(days=days, hours=4)
        )
    health = worker_health(now=now)
    tile = {t.label: t for section in health.sections for t in section.tiles}["Quarantined"]
    assert (tile.value, tile.alert) == (2, True)
    assert tile.note == "oldest 3 d 4 h"


def test_the_health_page_shows_the_quarantine_age(admin_client):
    row = baker.make(InboundEmail, status="quarantined")
    InboundEmail.objects.filter(pk=row.pk).update(finished_at=timezone.now() - timedelta(hours=5))
    page = admin_client.get(HEALTH_URL).content.decode()
    assert "oldest 5 h" in page and "oldest 5 h 0" not in page


def test_waits_read_as_words_not_raw_seconds(admin_client, capsys):
    """Issue 20: "oldest waiting 3723 s" became "1 h 2 min" on the page, in the finding and
    in worker_status's text output (its --json keeps the seconds)."""
    baker.make(
        Job,
        kind="report.render",
        status="queued",
        max_attempts=5,
        run_after=timezone.now() - timedelta(seconds=3723.4),
    )
    page = admin_client.get(HEALTH_URL).content.decode()
    assert "oldest waiting 1 h 2 min" in page
    assert "has been due for 1 h 2 min" in page
    assert "3723" not in page
    with pytest.raises(CommandError):
        call_command("worker_status")
    out = capsys.readouterr().out
    assert "waiting 1 h 2 min" in out and "has been due for 1 h 2 min" in out
    assert "3723" not in out


def _oldest_transaction_line(admin_client) -> tuple[str, str]:
    """The oldest-transaction line's opening tag and its text, as the page renders them."""
    html = admin_client.get(HEALTH_URL).content.decode()
    match = re.search(r'(<p id="oldest-transaction"[^>]*>)(.*?)</p>', html, re.S)
    assert match, "no oldest-transaction line on the page"
    return match[1], match[2]


def test_the_oldest_transaction_line_is_marked_only_past_the_alert_threshold(
    admin_client, settings
):
    """Issue 36.4: no test checked the mark (class long-transaction: its session in the error
    colour) that the line gets once the transaction is older than
    OPS_LONG_TRANSACTION_ALERT_SECONDS. The same transaction, older than 1 s, with the
    threshold above and below its age."""
    from django.db import connection

    from tests.support.processes import wait_until
    from tests.support.sessions import other_session

    report = other_session(application_name="quarterly-report")
    try:
        report.execute("SELECT 1")  # a transaction, open until the rollback below
        pid = report.info.backend_pid

        def age() -> float:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float "
                    "FROM pg_stat_activity WHERE pid = %s",
                    [pid],
                )
                return cursor.fetchone()[0]

        wait_until(lambda: age() > 1.0, "the report's transaction 1 s old", timeout=10)
        settings.OPS_LONG_TRANSACTION_ALERT_SECONDS = age() + 60
        below = _oldest_transaction_line(admin_client)
        settings.OPS_LONG_TRANSACTION_ALERT_SECONDS = 0.5
        above = _oldest_transaction_line(admin_client)
    finally:
        report.rollback()
        report.close()
    assert below[0] == '<p id="oldest-transaction">'
    assert above[0] == '<p id="oldest-transaction" class="long-transaction">'
    for _, text in (below, above):
        shown = rf"<strong>open [\d.]+ s: quarterly-report from 127\.0\.0\.1, pid {pid}, "
        assert re.search(shown, text), text
    html = admin_client.get(HEALTH_URL).content.decode()
    assert re.search(r"#oldest-transaction\.long-transaction strong \{ color: [^}]+\}", html)
