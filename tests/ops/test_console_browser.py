"""Issue 20, point 8: the operator console in Chromium at 1366 px and 390 px wide: the health
page, a job, a quarantined mail and the lists. No horizontal scroll on the page (tables
scroll inside their own box), no console error; a screenshot of each for a person to look at.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail
from jobs.models import Job, JobAttempt, PausedKind
from ops.models import JobPeriod
from processes.models import WorkerProcess
from tests.support.browser import PASSWORD, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WIDTHS = (1366, 390)
LONG = "ValueError: " + "a-very-long-unbroken-token-" * 12


@pytest.fixture
def console(django_user_model) -> dict[str, str]:
    now = timezone.now()
    failed = baker.make(
        Job,
        kind="report.render",
        status="failed",
        attempts=2,
        max_attempts=2,
        failed_at=now,
        last_error=f"{LONG}\n\nTraceback (most recent call last):\n  File x",
        locked_by="",
    )
    for number, outcome in ((1, "retried"), (2, "failed")):
        JobAttempt.objects.create(
            job_id=failed.pk,
            number=number,
            worker="worker-host-with-a-long-name.example.internal:31337:0badc0de",
            started_at=now - timedelta(seconds=30 * number),
            finished_at=now - timedelta(seconds=30 * number - 2),
            outcome=outcome,
            error=LONG,
        )
    baker.make(
        Job,
        kind="mail.relay",
        status="processing",
        attempts=1,
        max_attempts=5,
        locked_by="worker-host-with-a-long-name.example.internal:4242:deadbeef",
        lease_expires_at=now - timedelta(minutes=4),
    )
    PausedKind.objects.create(kind="report.render", paused_by="admin")
    baker.make(
        WorkerProcess,
        role="qcluster worker",
        host="worker-host-with-a-long-name.example.internal",
        pid=4242,
        version="0.1.0",
        started_at=now - timedelta(hours=2),
        heartbeat_at=now,
        interval_seconds=10,
        gone_after=now + timedelta(seconds=30),
        current="job #12345 report.render",
    )
    mail = baker.make(
        InboundEmail,
        store_key="inbound/" + "k" * 120,
        status="quarantined",
        reason="permanent_error",
        detail="the parser gave up",
        raw=(
            b"From: Ada <pi@university.example>\r\nTo: replies@reply.example\r\n"
            b"Subject: " + b"very long subject " * 10 + b"\r\n\r\nbody\r\n"
        ),
        last_error="Traceback (most recent call last):\n  File y\nRuntimeError: boom",
    )
    JobPeriod.objects.create(  # the per-kind table, with a long kind name
        start=now,
        kind="reports.render_the_quarterly_statistics_for_the_board_of_trustees",
        shard=0,
        completed=1234,
        failed=5,
        durations=[0] * 12 + [1234],
        waits=[1239] + [0] * 11,
    )
    baker.make(Job, kind="report.render", status="completed", max_attempts=1, completed_at=now)
    django_user_model.objects.create_superuser(username="operator", password=PASSWORD)
    return {
        "health": "/admin/worker-health/",
        "health-1h": "/admin/worker-health/?range=1h",
        "health-7d": "/admin/worker-health/?range=7d",
        "job": reverse("admin:jobs_job_change", args=[failed.pk]),
        "mail": reverse("admin:inbound_email_inboundemail_change", args=[mail.pk]),
        "jobs": reverse("admin:jobs_job_changelist"),
        "stuck": reverse("admin:jobs_job_changelist") + "?health=stuck",
        "mails": reverse("admin:inbound_email_inboundemail_changelist"),
        "error-groups": reverse("admin:jobs_job_error_groups"),
        "processes": reverse("admin:processes_workerprocess_changelist"),
    }


def _charts_are_legible(page, width: int) -> None:
    """One drawing of each chart shows (the narrow one on a phone), inside the window, its
    labels drawn at 9 px or more (an SVG scaled down to fit shrinks its text with it)."""
    shown = "narrow" if width < 900 else "wide"
    for chart in ("#jobs-chart", "#mail-chart"):
        svg = page.locator(f"{chart} svg.{shown}")
        assert svg.is_visible() and page.locator(f"{chart} svg:visible").count() == 1
        box = svg.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
        scale = box["width"] / float(svg.get_attribute("width"))
        font = page.evaluate(
            "s => parseFloat(getComputedStyle(s.querySelector('text.tick')).fontSize)",
            svg.element_handle(),
        )
        assert font * scale >= 9, (chart, width, font, scale)
        assert svg.locator("text.axis-label").first.text_content().startswith("jobs per") or (
            chart == "#mail-chart"
        )
    assert page.locator("#kinds").is_visible()
    assert page.locator("#range-select a").count() == 3


@pytest.mark.parametrize("width", WIDTHS)
def test_console_pages_fit_the_window_without_console_errors(
    browser, live_server, screenshot, console, width, django_user_model
):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": 900}, locale="en-GB"
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: list[str] = []
    page.on(
        "console",
        lambda msg: errors.append(f"{msg.text} {msg.location}") if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "response",
        lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    try:
        log_in(page, django_user_model.objects.get(username="operator"))
        overflowing = {}
        for name, url in console.items():
            response = page.goto(url)
            assert response.status == 200, (name, response.status)
            extra = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            if extra > 0:
                overflowing[name] = extra
            if name.startswith("health"):
                _charts_are_legible(page, width)
            screenshot(page, f"{name}-{width}")
        assert overflowing == {}, f"horizontal overflow (px) at {width}: {overflowing}"
        assert errors == []
    finally:
        context.close()
