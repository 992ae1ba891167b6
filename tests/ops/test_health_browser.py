"""The Worker health page in a real browser (Playwright + Debian's chromium), as a staff user:
reached from the admin index, tiles and charts drawn, tiles open the filtered changelists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail
from jobs.models import Job
from notifications.models import EmailNotification
from tests.support.browser import log_in, make_staff
from tests.support.finished_jobs import finish_jobs
from tests.support.leases import make_lease, spare_slots

pytestmark = pytest.mark.django_db(transaction=True)

OPERATOR_PERMISSIONS = [
    "jobs.view_job",
    "inbound_email.view_inboundemail",
    "inbound_email.view_reply",
    "notifications.view_emailnotification",
    "canonical_ids.view_writerslotlease",
]


@pytest.fixture
def busy_day() -> dict[str, Job]:
    """A day of traffic: jobs finishing every hour (a few failing), mail each hour, and one of
    each thing that needs an operator."""
    now = timezone.now()
    ends = []
    for hour in range(24):
        for i in range(hour % 5 + 1):
            ends.append((now - timedelta(hours=hour, minutes=7 * i + 1), "completed"))
        if hour % 6 == 2:
            ends.append((now - timedelta(hours=hour, minutes=3), "failed"))
    finish_jobs("report.render", ends)
    stuck = baker.make(
        Job,
        kind="mail.relay",
        status="processing",
        max_attempts=5,
        locked_by="host-b:42",
        lease_expires_at=now - timedelta(minutes=4),
    )
    baker.make(Job, kind="report.render", status="queued", max_attempts=5)
    statuses = ["processed", "processed", "rejected", "processed", "quarantined", "processed"]
    for hour in range(0, 24, 2):
        for i in range(hour % 4 + 1):
            row = baker.make(
                InboundEmail,
                store_key=f"inbound/{hour}-{i}",
                status=statuses[(hour + i) % len(statuses)],
            )
            at = now - timedelta(hours=hour, minutes=10 + i)
            InboundEmail.objects.filter(pk=row.pk).update(created_at=at)
    baker.make(EmailNotification, status="pending")
    baker.make(EmailNotification, status="sent", sent_at=now, ses_message_id="m-1")
    [slot] = spare_slots(1)
    make_lease(slot=slot, now=now, live=True, holder_host="host-a", holder_pid=311)
    return {"stuck": stuck}


def test_staff_user_reads_worker_health_and_follows_the_tiles(
    page, screenshot, django_user_model, busy_day
):
    operator = make_staff(django_user_model, username="operator", permissions=OPERATOR_PERMISSIONS)
    quarantined = InboundEmail.objects.filter(status="quarantined").count()
    log_in(page, operator)

    page.get_by_role("link", name="Worker health").click()
    page.wait_for_url("**/admin/worker-health/")
    assert page.locator("h1").inner_text() == "Worker health"
    findings = page.locator("#needs-operator li").all_inner_texts()
    assert any("stuck in processing past their lease" in line for line in findings)
    assert any(f"{quarantined} quarantined mail(s)" in line for line in findings)

    stuck_tile = page.locator("a.tile", has_text="stuck past their lease")
    assert stuck_tile.locator(".value").inner_text() == "1"
    assert "alert" in stuck_tile.get_attribute("class")
    assert page.locator("table.leases").inner_text().count("host-a:311") == 1

    # Both charts are drawn and have a real size on screen.
    jobs_chart = page.locator("#jobs-chart svg.wide")
    box = jobs_chart.bounding_box()
    assert box and box["width"] > 600 and box["height"] > 150
    assert not page.locator("#jobs-chart svg.narrow").is_visible()  # the wide one fits
    # 48 half-hour bars (issue 20: not 1,440 one-minute hairlines), y axis labelled
    assert page.locator("#jobs-chart").get_attribute("data-bars") == "48"
    completed = page.locator('#jobs-chart svg.wide g[data-series="completed"] rect')
    assert 0 < completed.count() <= 48
    assert jobs_chart.locator("text.axis-label").first.text_content() == "jobs per 30 min"
    assert page.locator("#mail-chart svg.wide rect").count() > 0
    assert "completed " in page.locator("#jobs-chart figcaption").inner_text()
    screenshot(page, "worker-health")

    stuck_tile.click()
    page.wait_for_url("**/admin/jobs/job/?health=stuck")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert str(busy_day["stuck"].pk) in rows.first.inner_text()
    screenshot(page, "stuck-jobs")

    page.go_back()
    page.locator("a.tile", has_text="Quarantined").click()
    page.wait_for_url("**/admin/inbound_email/inboundemail/?status__exact=quarantined")
    assert page.locator("#result_list tbody tr").count() == quarantined
    screenshot(page, "quarantined-mail")
