"""Issue 20, point 4: the Worker health page refreshes its figures by itself, and waits while
a person interacts (text selected, a field in use, a section open, the pointer on a chart).

Driven in Chromium with `?refresh=1` (one second) so the tests need not wait long; nothing
is timed: the script counts its refreshes and its checks that found a person busy on <html>
(data-health-refreshes, data-health-paused-checks), and the tests wait for those counts.
"""

from __future__ import annotations

import pytest
from django.utils import timezone
from model_bakery import baker

from jobs.models import Job
from tests.support.browser import PASSWORD, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

URL = "/admin/worker-health/?refresh=1"


def _count(page, name: str) -> int:
    return int(page.evaluate(f"document.documentElement.dataset.{name} || '0'"))


def _wait_for(page, name: str, at_least: int) -> None:
    page.wait_for_function(f"Number(document.documentElement.dataset.{name} || 0) >= {at_least}")


@pytest.fixture
def health(page, django_user_model):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    operator = django_user_model.objects.create_superuser(username="operator", password=PASSWORD)
    log_in(page, operator)
    page.goto(URL)
    yield page
    assert errors == []


def _completed_tile(page) -> str:
    return page.locator("a.tile[data-label='completed'] .value").inner_text()


def test_the_page_refreshes_itself_while_nobody_interacts(health, screenshot):
    page = health
    assert _completed_tile(page) == "0"
    generated = page.locator("#read-at").get_attribute("data-generated")
    baker.make(
        Job, kind="report.render", status="completed", max_attempts=1, completed_at=timezone.now()
    )

    _wait_for(page, "healthRefreshes", 1)

    assert page.locator("#read-at").get_attribute("data-generated") != generated
    assert _completed_tile(page) == "1"  # the new figure, without a reload
    assert page.url.endswith(URL)  # same address: range and interval kept
    assert page.locator("#content-main").count() == 1
    screenshot(page, "refreshed")


@pytest.mark.parametrize(
    "interaction", ["select text", "type in a field", "open details", "hover a chart"]
)
def test_the_page_waits_while_a_person_interacts(health, screenshot, interaction):
    page = health
    _wait_for(page, "healthRefreshes", 1)  # the script runs
    if interaction == "select text":
        page.evaluate(
            "window.getSelection().selectAllChildren(document.querySelector('#content-main h2'))"
        )
    elif interaction == "type in a field":
        page.locator("#toggle-nav-sidebar").click()  # the side bar starts closed (issue 31.6)
        page.locator("#nav-filter").fill("jo")
    elif interaction == "open details":
        page.locator("#about-figures summary").click()
        page.mouse.move(1, 1)
        page.evaluate("document.activeElement.blur()")
    else:
        page.locator("#jobs-chart svg.wide").hover()
    refreshes = _count(page, "healthRefreshes")
    generated = page.locator("#read-at").get_attribute("data-generated")
    checks = _count(page, "healthPausedChecks")

    _wait_for(page, "healthPausedChecks", checks + 4)  # it looked four times, found them busy

    assert _count(page, "healthRefreshes") == refreshes
    assert page.locator("#read-at").get_attribute("data-generated") == generated
    assert page.locator("#health-refresh").get_attribute("data-state") == "paused"
    screenshot(page, "paused")

    # The person is done: the figures refresh again.
    if interaction == "select text":
        page.evaluate("window.getSelection().removeAllRanges()")
    elif interaction == "type in a field":
        page.locator("#nav-filter").blur()
    elif interaction == "open details":
        page.locator("#about-figures summary").click()
        page.evaluate("document.activeElement.blur()")
    else:
        page.mouse.move(1, 1)
    _wait_for(page, "healthRefreshes", refreshes + 1)
    assert page.locator("#read-at").get_attribute("data-generated") != generated


def test_refresh_can_be_turned_off_and_range_links_keep_the_interval(health):
    page = health
    assert page.locator("#range-select a", has_text="7 d").get_attribute("href") == (
        "?range=7d&refresh=1#charts"
    )
    page.goto("/admin/worker-health/?refresh=0")
    assert page.locator("#health-refresh").get_attribute("data-state") == "disabled"
    assert "Automatic refresh is off" in page.locator("#health-refresh").inner_text()
