"""The one-click unsubscribe's confirm page in a real browser (Playwright + Debian's
chromium): the link from a notice shows one button; pressing it pauses the PI's mail."""

from __future__ import annotations

import pytest
from django.utils import timezone

from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_new_proposals
from notifications.unsubscribe import unsubscribe_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_confirm_page_has_one_button_that_unsubscribes(page, screenshot, make_pi, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PUBLIC_BASE_URL = "https://assistant.example.org"
    pi = make_pi(first_name="Ada", last_name="Lovelace")
    sweep_new_proposals(now=timezone.now())
    row = EmailNotification.objects.get(user=pi)
    path = unsubscribe_url(row.pk).removeprefix(settings.PUBLIC_BASE_URL)

    page.goto(path)
    assert page.locator("h1").inner_text() == "Stop these emails?"
    assert page.locator("button").count() == 1
    assert "Ada Lovelace" in page.inner_text("main")
    screenshot(page, "confirm")
    assert not NotificationPreference.objects.filter(user=pi, rung="paused").exists()

    page.click("#unsubscribe")
    page.wait_for_selector("#done")
    assert page.locator("h1").inner_text() == "You are unsubscribed"
    screenshot(page, "done")
    assert NotificationPreference.objects.get(user=pi).rung == "paused"
