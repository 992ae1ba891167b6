"""Issue 36.8: the admin under gunicorn (DEBUG off), its DATABASE_URL naming a server that is
not running: the login form still shows, and signing in answers the "database is not
reachable" page, in a real browser at 1366 and 390 px, the web process's log saying so once.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from tests.support.browser import PASSWORD
from tests.support.processes import child_env
from tests.support.web import gunicorn

pytestmark = pytest.mark.slow

WIDTHS = (1366, 390)


@pytest.fixture
def stopped_database(tmp_path):
    """gunicorn whose DATABASE_URL's port has no server (a password in it, never shown)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgres://operator:s3cret-pw@127.0.0.1:{port}/worker"
    env = child_env(
        DEBUG="false", WORKER_VAR_DIR=str(tmp_path), ALLOWED_HOSTS="127.0.0.1", DATABASE_URL=url
    )
    log = tmp_path / "gunicorn.log"
    with gunicorn(env, log) as base_url:
        yield base_url, port, log


def test_the_admin_says_the_database_is_not_reachable(browser, stopped_database, screenshot):
    base_url, port, log = stopped_database
    where = f"127.0.0.1:{port}, database worker"
    request = urllib.request.Request(
        f"{base_url}/admin/", headers={"Cookie": "sessionid=" + "a" * 32}
    )
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=30)
    assert answered.value.code == 503
    assert f"The database is not reachable: {where}." in answered.value.read().decode()

    for width in WIDTHS:
        context = browser.new_context(
            base_url=base_url, viewport={"width": width, "height": 900}, locale="en-GB"
        )
        page = context.new_page()
        try:
            page.goto("/admin/")  # no session yet: the login form, which needs no database
            assert page.title() == "Log in | Proposal-assistant worker"
            page.fill("#id_username", "operator")
            page.fill("#id_password", PASSWORD)
            with page.expect_response("**/admin/login/**") as signed_in:
                page.click("input[type=submit]")
            assert signed_in.value.status == 503
            assert page.title() == "The database is not reachable | Proposal-assistant worker"
            assert page.locator("#site-name").inner_text() == "Proposal-assistant worker"
            text = page.locator("#content").inner_text()
            assert f"The database is not reachable: {where}." in text
            assert "Is run-worker running?" in text and "Is PostgreSQL running?" in text
            overflow = page.evaluate(
                "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, (width, overflow)
            screenshot(page, f"database-down-{width}")
        finally:
            context.close()

    lines = log.read_text()
    assert "Server Error" not in lines and "Traceback" not in lines
    assert lines.count("is not reachable") == 1, lines  # three requests, one line
    assert f"GET /admin/: the database at {where} is not reachable" in lines
    assert "s3cret-pw" not in lines
