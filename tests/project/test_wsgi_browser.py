"""Issue 19.4: under gunicorn with DEBUG off the admin is styled (WhiteNoise serves its
static files), checked in a real browser."""

from __future__ import annotations

import urllib.request

import pytest

from tests.support.browser import log_in, make_staff
from tests.support.processes import child_env
from tests.support.web import gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def production_admin(tmp_path):
    env = child_env(DEBUG="false", WORKER_VAR_DIR=str(tmp_path), ALLOWED_HOSTS="127.0.0.1")
    with gunicorn(env, tmp_path / "gunicorn.log") as url:
        yield url


def test_the_admin_is_styled_under_gunicorn_with_debug_off(
    browser, production_admin, screenshot, django_user_model
):
    with urllib.request.urlopen(f"{production_admin}/static/admin/css/base.css") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/css")
        assert "max-age" in response.headers["Cache-Control"]
    # The collected files are what is served (the image's collectstatic), gzipped on request.
    gzipped = urllib.request.Request(
        f"{production_admin}/static/admin/css/base.css", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(gzipped) as response:
        assert response.headers["Content-Encoding"] == "gzip"
    with urllib.request.urlopen(f"{production_admin}/admin/login/") as response:
        assert "Server Error" not in response.read().decode()

    context = browser.new_context(
        base_url=production_admin, viewport={"width": 1280, "height": 900}
    )
    page = context.new_page()
    try:
        operator = make_staff(django_user_model, username="operator", permissions=[])
        log_in(page, operator)
        # base.css loaded and applied: the header bar takes the admin's colours and layout.
        header = page.evaluate(
            "() => { const s = getComputedStyle(document.querySelector('#header'));"
            " return [s.backgroundColor, s.display]; }"
        )
        assert header == ["rgb(65, 118, 144)", "flex"], header
        sheets = page.evaluate(
            "() => [...document.styleSheets].filter(s => s.href && s.cssRules.length)"
            ".map(s => new URL(s.href).pathname)"
        )
        assert "/static/admin/css/base.css" in sheets
        screenshot(page, "admin-index")
    finally:
        context.close()
