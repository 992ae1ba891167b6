"""Quarantined mail in the admin, in a real browser (Playwright + Debian's chromium), as a
staff operator: hostile mail is shown as text (no script runs, nothing is fetched), and the
reprocess and discard actions do what they say."""

from __future__ import annotations

import re

import pytest
from model_bakery import baker

from inbound_email.models import InboundEmail
from inbound_email.parsing import raw_preview
from inbound_email.poller import poll_once
from tests.support.browser import log_in, make_staff
from tests.support.mail import build_mail
from tests.support.stores import FlakyStore

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = (
    "Rating: 4\n<script>window.pwned = 1; alert('pwned')</script>"
    '<img src="http://tracker.example/p.gif" onerror="window.pwned = 2">'
)
CHANGE_PAGE = re.compile(r"/admin/inbound_email/inboundemail/\d+/change/")
LIST_URL = "/admin/inbound_email/inboundemail/?status__exact=quarantined"


@pytest.fixture
def quarantined(folder_store, notification) -> dict[str, InboundEmail]:
    """Two quarantined mails: `poison-a` by the poller itself (a permanent store error, so it
    was never read), `poison-b` as the poller leaves a mail that failed after it was read:
    the raw source kept and previewed by the same raw_preview the failure path uses."""
    folder_store.put("poison-a", build_mail(token=notification.token, body=HOSTILE))
    poll_once(store=FlakyStore(folder_store, failing={"poison-a": False}))
    raw = build_mail(token=notification.token, subject="<b>Re: budget</b>", body=HOSTILE)
    headers_text, body_text = raw_preview(raw)
    folder_store.put("quarantine/poison-b", raw)
    baker.make(
        InboundEmail,
        store_key="poison-b",
        status="quarantined",
        reason="permanent_error",
        detail="ValueError: simulated failure after reading",
        attempts=1,
        raw=raw,
        size=len(raw),
        headers_text=headers_text,
        body_text=body_text,
        quarantine_key="quarantine/poison-b",
        intake_deleted=True,
    )
    rows = {row.store_key: row for row in InboundEmail.objects.all()}
    assert {row.status for row in rows.values()} == {"quarantined"}
    return rows


def _watch(page, origin: str) -> dict[str, list[str]]:
    """Record what the page does that it must not: dialogs, and requests to anywhere but the
    admin's own server (a tracking pixel in the mail would be one)."""
    seen: dict[str, list[str]] = {"dialogs": [], "external": []}

    def on_dialog(dialog) -> None:
        seen["dialogs"].append(dialog.message)
        dialog.dismiss()

    def on_request(request) -> None:
        if not request.url.startswith(origin):
            seen["external"].append(request.url)

    page.on("dialog", on_dialog)
    page.on("request", on_request)
    return seen


def test_operator_views_quarantined_mail_safely_then_reprocesses_and_discards_it(
    page, screenshot, django_user_model, quarantined, folder_store, live_server
):
    operator = make_staff(
        django_user_model,
        username="mailops",
        permissions=["inbound_email.view_inboundemail", "inbound_email.change_inboundemail"],
    )
    seen = _watch(page, live_server.url)
    log_in(page, operator)
    page.goto(LIST_URL)
    assert page.locator("#result_list tbody tr").count() == 2
    screenshot(page, "quarantine-list")

    # View safely: the mail's markup is text on the page, never elements; nothing runs or loads.
    page.locator("#result_list tbody tr", has_text="poison-b").locator("th a").click()
    page.wait_for_url(CHANGE_PAGE)
    body = page.locator(".field-body_view pre")
    # (the preview is the undecoded source: quoted-printable shows "=3D" for "=")
    assert "<script>window.pwned =3D 1; alert('pwned')</script><img src=" in body.inner_text()
    assert "<b>Re: budget</b>" in page.locator(".field-headers_view pre").inner_text()
    assert page.locator(".field-body_view script, .field-body_view img, b").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.get_by_role("link", name="Download .eml").count() == 1
    screenshot(page, "quarantined-mail-detail")

    # A mail that was never read says so, and shows why it was quarantined.
    page.goto(LIST_URL)
    page.locator("#result_list tbody tr", has_text="poison-a").locator("th a").click()
    page.wait_for_url(CHANGE_PAGE)
    assert page.locator(".field-body_view pre").inner_text() == "(empty or not read)"
    assert "simulated failure on poison-a" in page.locator(".field-error_view").inner_text()
    screenshot(page, "unread-quarantined-mail-detail")

    # Reprocess: back into the intake with a fresh attempt budget.
    page.goto(LIST_URL)
    page.locator("#result_list tbody tr", has_text="poison-a").locator(
        "input.action-select"
    ).check()
    page.select_option("select[name=action]", "reprocess")
    page.click("button[name=index]")
    assert "1 mail(s) queued for reprocessing." in page.locator("ul.messagelist").inner_text()
    screenshot(page, "after-reprocess")
    reprocessed = InboundEmail.objects.get(store_key="poison-a")
    assert (reprocessed.status, reprocessed.attempts) == ("received", 0)
    assert folder_store.exists("poison-a")  # back in the intake for the next poll

    # Discard: marked discarded and the stored copy deleted for good.
    assert folder_store.exists("quarantine/poison-b")
    page.goto(LIST_URL)
    assert page.locator("#result_list tbody tr").count() == 1
    page.locator("#result_list tbody tr", has_text="poison-b").locator(
        "input.action-select"
    ).check()
    page.select_option("select[name=action]", "discard")
    page.click("button[name=index]")
    # A confirmation page first (issue 31.6): nothing is gone until it is confirmed.
    assert "Are you sure" in page.locator("#content").inner_text()
    screenshot(page, "discard-confirmation")
    assert folder_store.exists("quarantine/poison-b")
    page.click("#discard-confirm input[type=submit]")
    assert "1 mail(s) discarded." in page.locator("ul.messagelist").inner_text()
    screenshot(page, "after-discard")
    discarded = InboundEmail.objects.get(store_key="poison-b")
    assert discarded.status == "discarded"
    assert not folder_store.exists("quarantine/poison-b")

    assert seen["dialogs"] == []
    assert seen["external"] == []


def test_an_attachment_the_store_refused_shows_why_and_downloads_from_the_raw_mail(
    page, screenshot, django_user_model, folder_store, notification, settings
):
    """Issue 28.1: an operator finds a reply's attachment the store refused: its long
    Chinese name, the state "kept in raw, the store write failed", the store's error, and a
    download of the raw mail that holds it."""
    from tests.inbound_email.services.test_attachment_names import CHINESE
    from tests.support.mail import PDF, with_attachments

    settings.INBOUND_EMAIL_ATTACHMENTS_PREFIX = ".attachments/"
    folder_store.root.mkdir(parents=True, exist_ok=True)
    (folder_store.root / ".attachments").write_bytes(b"not a folder")
    raw = build_mail(
        token=notification.token,
        body="Please see my comments attached.",
        attach=with_attachments(pdf_name=CHINESE + ".pdf"),
    )
    folder_store.put("reply", raw)
    poll_once()
    operator = make_staff(
        django_user_model,
        username="operator",
        permissions=["inbound_email.view_replyattachment", "inbound_email.view_inboundemail"],
    )
    log_in(page, operator)

    page.goto("/admin/inbound_email/replyattachment/?state__exact=not_stored")
    row = page.locator("#result_list tbody tr")
    assert row.count() == 1
    assert "Kept in raw, the store write failed" in row.inner_text()
    screenshot(page, "refused-attachment-list")
    row.locator("th a").click()
    page.wait_for_url(re.compile(r"/admin/inbound_email/replyattachment/\d+/change/"))
    assert page.locator(".field-filename .readonly").inner_text().endswith(".pdf")
    assert "Not a directory" in page.locator(".field-store_error .readonly").inner_text()
    screenshot(page, "refused-attachment-detail")
    with page.expect_download() as download:
        page.get_by_role("link", name="download .eml").click()
    saved = download.value.path().read_bytes()
    assert saved == raw and PDF[:20] not in saved  # the PDF is in the raw, base64-encoded
