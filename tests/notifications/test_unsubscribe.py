"""Issue 23.3: one-click unsubscribe (RFC 8058). Every notification carries an https link and
List-Unsubscribe-Post when PUBLIC_BASE_URL is set; the link pauses the PI's mail as the mailto
unsubscribe does, on a POST with no login and no CSRF token."""

from __future__ import annotations

import re

import pytest
from django.core import mail, signing
from django.core.checks import run_checks
from django.test import Client
from django.utils import timezone

from notifications.models import EmailNotification, NotificationPreference, UnsubscribeRevocation
from notifications.sweeps import sweep_new_proposals
from notifications.unsubscribe import unsubscribe_token

pytestmark = pytest.mark.django_db
BASE = "https://assistant.example.org"


@pytest.fixture
def sent(make_pi, settings):
    """A PI and the new-proposal notice the sweep mailed them (Django's locmem backend)."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PUBLIC_BASE_URL = BASE
    pi = make_pi()
    assert sweep_new_proposals(now=timezone.now()).sent == 1
    return pi, EmailNotification.objects.get(user=pi), mail.outbox[0]


def _link(message) -> str:
    return re.match(r"<(https://[^>]+)>", message.extra_headers["List-Unsubscribe"]).group(1)


def test_every_notice_carries_the_one_click_link_and_the_mailto(sent):
    pi, row, message = sent
    header = message.extra_headers["List-Unsubscribe"]
    token = unsubscribe_token(row.pk)
    assert header == (
        f"<{BASE}/unsubscribe/{token}>, "
        f"<mailto:replies+{row.token}@reply.localhost?subject=unsubscribe>"
    )
    assert message.extra_headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_without_a_public_base_url_the_header_is_mailto_only(make_pi, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PUBLIC_BASE_URL = ""
    make_pi()
    sweep_new_proposals(now=timezone.now())
    headers = mail.outbox[0].extra_headers
    assert headers["List-Unsubscribe"].startswith("<mailto:")
    assert "https://" not in headers["List-Unsubscribe"]
    assert "List-Unsubscribe-Post" not in headers


def test_check_deploy_warns_without_a_public_base_url(settings):
    settings.PUBLIC_BASE_URL = ""
    ids = {m.id for m in run_checks(include_deployment_checks=True)}
    assert "notifications.W001" in ids
    settings.PUBLIC_BASE_URL = BASE
    ids = {m.id for m in run_checks(include_deployment_checks=True)}
    assert not ids & {"notifications.W001", "notifications.W002"}


def test_a_one_click_post_with_no_login_and_no_csrf_pauses_the_pi_idempotently(sent):
    """What Gmail's button sends: POST, body List-Unsubscribe=One-Click, no cookie."""
    pi, row, message = sent
    client = Client(enforce_csrf_checks=True)
    path = _link(message).removeprefix(BASE)
    for _ in range(2):
        response = client.post(
            path,
            data="List-Unsubscribe=One-Click",
            content_type="application/x-www-form-urlencoded",
        )
        assert response.status_code == 200
        assert NotificationPreference.objects.get(user=pi).rung == "paused"
    # Paused exactly as the mail unsubscribe pauses: the next proposal is not mailed.
    pi.proposals.create(title="Another", status="in_review")
    assert sweep_new_proposals(now=timezone.now()).sent == 0


def test_get_shows_a_confirm_page_with_one_button_and_changes_nothing(sent):
    pi, _, message = sent
    page = Client().get(_link(message).removeprefix(BASE))
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count("<button") == 1 and 'method="post"' in html
    assert not NotificationPreference.objects.filter(user=pi, rung="paused").exists()


def test_a_forged_or_revoked_link_does_nothing(sent):
    pi, row, message = sent
    path = _link(message).removeprefix(BASE)
    client = Client(enforce_csrf_checks=True)
    assert client.post(path[:-3] + "xyz").status_code == 404
    assert client.post(f"/unsubscribe/{row.token}").status_code == 404  # unsigned
    UnsubscribeRevocation.objects.create(notification=row, reason="forwarded to a list")
    assert client.post(path).status_code == 404
    assert client.get(path).status_code == 404
    assert not NotificationPreference.objects.filter(user=pi, rung="paused").exists()


def test_the_link_shows_neither_the_reply_token_nor_the_bounce_address(sent):
    """Issue 28.5: the link is a signed notification id; what proves a bounce is not in it."""
    _, row, message = sent
    link = _link(message)
    assert row.token not in link
    assert "bounce" not in link and message.from_email not in link


def test_a_link_mailed_before_issue_28_still_unsubscribes_until_revoked(sent):
    """Links already mailed (the reply token signed under the old salt) keep working, and a
    revocation stops them as it stops the new ones."""
    pi, row, _ = sent
    old = f"/unsubscribe/{signing.Signer(salt='notifications.unsubscribe').sign(row.token)}"
    client = Client(enforce_csrf_checks=True)
    assert client.get(old).status_code == 200
    revocation = UnsubscribeRevocation.objects.create(notification=row, reason="forwarded")
    assert client.get(old).status_code == 404
    assert client.post(old).status_code == 404
    assert not NotificationPreference.objects.filter(user=pi, rung="paused").exists()
    revocation.delete()
    assert client.post(old).status_code == 200
    assert NotificationPreference.objects.get(user=pi).rung == "paused"
