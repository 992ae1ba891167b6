"""Issues 20.8 and 31.6: the operator console in Chromium at 1366 px and 390 px wide, every
page of it: the index, each registered model's changelist, change page (with a row), history,
add and delete pages, the views the ModelAdmins add, the Worker health page at each range,
and the confirmation pages (discard a mail, delete selected rows).

On each page: no horizontal scroll (tables may scroll inside their own box on a phone, never
on a desktop: at 1366 px no table hides a column), no word squeezed to a letter per line, no
console error; a screenshot of each for a person to look at.
"""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from tests.support.admin_rows import admin_pages, console_rows
from tests.support.browser import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WIDTHS = (1366, 390)
DESKTOP = 1366

# Page-level overflow, text squeezed to a few letters per line (the index's "Worker health"
# was one letter per line at 390 px), and, at desktop width, tables whose box hides columns.
LAYOUT = """(desktop) => {
  const doc = document.documentElement;
  const squeezed = [];
  const cells = '#content a, #content th, #content td, #content caption';
  for (const el of document.querySelectorAll(cells)) {
    const text = (el.innerText || '').trim();
    if (text.length < 4 || el.offsetParent === null) continue;
    const style = getComputedStyle(el);
    const font = parseFloat(style.fontSize);
    const lines = el.getBoundingClientRect().height / (parseFloat(style.lineHeight) || font * 1.2);
    const longestWord = Math.max(...text.split(/\\s+/).map(w => w.length));
    if (lines > 2.5 && el.getBoundingClientRect().width < 3 * font && longestWord >= 4) {
      squeezed.push(text.slice(0, 40));
    }
  }
  const hidden = [];
  if (desktop) {
    for (const box of document.querySelectorAll('#content .results, #content .table-box')) {
      if (box.offsetParent !== null && box.scrollWidth > box.clientWidth + 1) {
        hidden.push(`${box.className}: ${box.scrollWidth - box.clientWidth}px`);
      }
    }
  }
  return {overflow: doc.scrollWidth - doc.clientWidth, squeezed, hidden};
}"""


@pytest.fixture
def pages(django_user_model) -> dict[str, str]:
    custom = console_rows(django_user_model)
    request = RequestFactory().get("/admin/")
    request.user = django_user_model.objects.get(username="operator")
    return {**admin_pages(request), **custom}


def _check(page, width: int, name: str, screenshot, problems: dict) -> None:
    layout = page.evaluate(LAYOUT, width >= DESKTOP)
    found = {k: v for k, v in layout.items() if v}
    if found:
        problems[name] = found
    screenshot(page, f"{name}-{width}")


def _confirmation_pages(page, width: int, screenshot, problems: dict, pages: dict) -> None:
    """The pages that only a POST shows: discard one mail, discard selected mails, delete
    selected rows (Django's own intermediate page)."""
    page.goto(pages["quarantined-mail"])
    page.click("#mail-actions button:has-text('Discard')")
    assert "Are you sure" in page.locator("#content").inner_text()
    _check(page, width, "discard-one-confirmation", screenshot, problems)

    for name, model, action in (
        ("discard-selected-confirmation", "inbound_email_inboundemail", "discard"),
        ("delete-selected-confirmation", "jobs_pausedkind", "delete_selected"),
    ):
        page.goto(pages[f"{model}-list"])
        page.locator("#result_list tbody input.action-select").first.check()
        page.select_option("select[name=action]", action)
        page.click("button[name=index]")
        assert "Are you sure" in page.locator("#content").inner_text(), name
        _check(page, width, name, screenshot, problems)


@pytest.mark.parametrize("width", WIDTHS)
def test_every_console_page_fits_the_window_without_console_errors(
    browser, live_server, screenshot, pages, width, django_user_model
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
        problems: dict[str, dict] = {}
        for name, url in pages.items():
            response = page.goto(url)
            assert response.status == 200, (name, url, response.status)
            if name.startswith("health"):
                _charts_are_legible(page, width)
            _check(page, width, name, screenshot, problems)
        _confirmation_pages(page, width, screenshot, problems, pages)
        assert problems == {}, f"layout problems at {width} px: {problems}"
        assert errors == []
    finally:
        context.close()


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
