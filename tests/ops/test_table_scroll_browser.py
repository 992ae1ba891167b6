"""Issue 36.8, in Chromium at 1366 and 390 px: a table wider than its box on a phone says
so (a line naming the columns out of view, a shadow on the edge with more), an error
group's actions are in view, and the pages this issue changed render without overflow.

At 390 px the processes' heartbeat, the schedules' next run and an error group's message
and "Retry all" were out of view with nothing showing that the table scrolled.
"""

from __future__ import annotations

import pytest
from django.urls import reverse
from model_bakery import baker

from tests.support.admin_rows import console_rows
from tests.support.browser import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WIDTHS = (1366, 390)
PHONE = 390

HINT = """(box) => {
  const frame = document.querySelector(box).closest('.scroll-frame');
  const hint = frame.previousElementSibling;
  return {hint: hint.hidden ? null : hint.textContent, classes: [...frame.classList].sort()};
}"""
OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.fixture
def rows(django_user_model) -> dict[str, str]:
    from inbound_email.models import InboundEmail
    from inbound_email.parsing import raw_preview
    from jobs.error_groups import job_error_groups
    from jobs.models import Job

    pages = console_rows(django_user_model)
    raw = (
        b"From: Ada Lovelace <pi@university.example>\r\nTo: replies@reply.example\r\n"
        b"Subject: Re: budget\r\nDate: Sun, 06 Dec 2026 10:00:00 +0000\r\n"
        + b"".join(b"X-Relay-Hop-%d: hop\r\n" % n for n in range(1100))
        + b"\r\nRating: 4\r\n"
    )
    mail = baker.make(
        InboundEmail,
        store_key="inbound/many-headers",
        status="quarantined",
        reason="header_count_limit",
        detail="INBOUND_EMAIL_MAX_HEADERS: more than 1000 header fields",
        raw=raw,
        size=len(raw),
        headers_text=raw_preview(raw)[0],
    )
    failed = Job.objects.filter(status="failed").first()
    baker.make(Job, kind="report.render", max_attempts=3, _quantity=2)  # queued: cancellable
    group = job_error_groups()[0].key
    return {
        **pages,
        "processes": reverse("admin:processes_workerprocess_changelist"),
        "schedules": reverse("admin:django_q_schedule_changelist"),
        "error-groups": reverse("admin:jobs_job_error_groups"),
        "header-limit-mail": reverse("admin:inbound_email_inboundemail_change", args=[mail.pk]),
        "failed-job": reverse("admin:jobs_job_change", args=[failed.pk]),
        "group-key": group,
    }


def _context(browser, live_server, width: int):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": 900}, locale="en-GB"
    )
    context.set_default_timeout(15_000)
    return context


def _shot(page, screenshot, name: str, width: int) -> None:
    assert page.evaluate(OVERFLOW) <= 0, (name, width)
    screenshot(page, f"{name}-{width}")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_table_wider_than_the_phone_names_what_is_out_of_view(
    browser, live_server, screenshot, rows, width, django_user_model
):
    context = _context(browser, live_server, width)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto("/admin/login/")
        assert page.title() == "Log in | Proposal-assistant worker"
        _shot(page, screenshot, "login", width)
        log_in(page, django_user_model.objects.get(username="operator"))
        assert page.title() == "Operator console | Proposal-assistant worker"
        assert page.locator("#site-name").inner_text() == "Proposal-assistant worker"
        _shot(page, screenshot, "index", width)

        for name, column in (("processes", "Heartbeat at"), ("schedules", "Next Run")):
            page.goto(rows[name])
            page.wait_for_function("document.querySelector('#changelist .scroll-frame')")
            shown = page.evaluate(HINT, "#changelist .results")
            if width == PHONE:
                assert shown["hint"].startswith("Scroll → for: "), (name, shown)
                assert column in shown["hint"], (name, shown)
                assert "more-right" in shown["classes"] and "more-left" not in shown["classes"]
                _shot(page, screenshot, name, width)
                # Scrolled to the end: the hint names the columns passed, the shadow moves.
                page.evaluate(
                    "() => { const b = document.querySelector('#changelist .results');"
                    " b.scrollLeft = b.scrollWidth; }"
                )
                page.wait_for_function(
                    "document.querySelector('#changelist .scroll-frame')"
                    ".classList.contains('more-left')"
                )
                ended = page.evaluate(HINT, "#changelist .results")
                assert ended["hint"].startswith("← ") and "Scroll →" not in ended["hint"], ended
                assert "more-right" not in ended["classes"]
                _shot(page, screenshot, f"{name}-scrolled", width)
            else:
                assert shown == {"hint": None, "classes": ["scroll-frame"]}, (name, shown)
                _shot(page, screenshot, name, width)

        # The error groups: the actions right after the count, in view on a phone too.
        page.goto(rows["error-groups"])
        row = page.locator(f"#group-{rows['group-key']}")
        for button in ("Retry all", "Cancel all"):
            box = row.locator(f"button:has-text('{button}')").bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= width, (button, box)
        shown = page.evaluate(HINT, "#error-groups")
        if width == PHONE:
            assert "message, and the newest one's" in shown["hint"], shown
        else:
            assert shown["hint"] is None, shown
        _shot(page, screenshot, "error-groups", width)

        # Cancel all asks first; so do the job's Cancel button and the list's action.
        row.locator("button:has-text('Cancel all')").click()
        assert "Are you sure you want to cancel" in page.locator("#content").inner_text()
        _shot(page, screenshot, "cancel-all-confirmation", width)
        page.click("a.cancel-link")  # No, take me back
        page.goto(rows["failed-job"])
        page.click("#job-actions button:has-text('Cancel')")
        assert "Are you sure you want to cancel job #" in page.locator("#content").inner_text()
        _shot(page, screenshot, "cancel-job-confirmation", width)
        page.goto(reverse("admin:jobs_job_changelist") + "?status__exact=queued")
        page.locator("#result_list tbody input.action-select").first.check()
        page.select_option("select[name=action]", "cancel")
        page.click("button[name=index]")
        text = page.locator("#content").inner_text()
        assert "selected job(s) that are queued, failed or running" in text
        _shot(page, screenshot, "cancel-selected-confirmation", width)

        # The quarantined mail past a header limit: its summary reads the headers below.
        page.goto(rows["header-limit-mail"])
        assert page.locator("#mail-from").inner_text() == "pi@university.example"
        assert page.locator("#mail-subject").inner_text() == "Re: budget"
        assert page.locator("#mail-date").inner_text() == "2026-12-06 10:00:00 UTC"
        assert "could not be read" not in page.locator("#mail-summary").inner_text()
        _shot(page, screenshot, "header-limit-mail", width)

        # The health page's per-kind table says what it covers.
        page.goto(rows["health-1h"])
        head = page.locator("#kinds-head").inner_text()
        assert "the 30-minute periods that overlap the last 1 h" in head, head
        _shot(page, screenshot, "health-1h", width)
        assert errors == []
    finally:
        context.close()


def test_a_table_that_fits_again_drops_its_hint(browser, live_server, rows, django_user_model):
    """The signs follow the window: a phone turned to landscape width loses them."""
    context = _context(browser, live_server, PHONE)
    page = context.new_page()
    try:
        log_in(page, django_user_model.objects.get(username="operator"))
        page.goto(rows["processes"])
        page.wait_for_function("document.querySelector('#changelist .scroll-frame')")
        assert page.evaluate(HINT, "#changelist .results")["hint"]
        assert page.get_attribute("#changelist .results", "tabindex") == "0"
        page.set_viewport_size({"width": 1366, "height": 900})
        page.wait_for_function(
            "document.querySelector('#changelist .scroll-frame').previousElementSibling.hidden"
        )
        assert page.evaluate(HINT, "#changelist .results")["classes"] == ["scroll-frame"]
        assert page.get_attribute("#changelist .results", "tabindex") is None
    finally:
        context.close()
