"""Real-browser fixtures: Playwright (PyPI) driving Debian's chromium against live_server.

Registered as a pytest plugin by tests/conftest.py. Screenshots go to var/screenshots/
(SCREENSHOT_DIR overrides) and each path is printed, so a person can look at what the page
showed. Without chromium the tests skip locally and fail in CI (CI=true), where .ci/run
installs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
SCREENSHOT_DIR = Path(
    os.environ.get("SCREENSHOT_DIR", Path(__file__).resolve().parents[2] / "var" / "screenshots")
)
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} not found: apt-get install -y chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; Django then refuses ORM calls
    # from it unless told that this synchronous test code is safe.
    # Restored afterwards, so no other test runs with the check off.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            args = ["--no-sandbox"] if os.geteuid() == 0 else []
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser, live_server) -> Iterator[Any]:
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": 1280, "height": 900}, locale="en-GB"
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def screenshot(request) -> Callable[[Any, str], Path]:
    """screenshot(page, "name") -> the PNG's path (full page), printed for the log."""

    def take(page: Any, name: str) -> Path:
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOT_DIR / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path

    return take


def make_staff(django_user_model, *, username: str, permissions: list[str]):
    """A staff user (not a superuser) holding exactly `permissions` ("app.codename")."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(
        username=username, password=PASSWORD, is_staff=True
    )
    for dotted in permissions:
        app_label, codename = dotted.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


def log_in(page: Any, user, next_url: str = "/admin/") -> None:
    """Through the admin's login form, as a person would."""
    page.goto(f"/admin/login/?next={next_url}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")
