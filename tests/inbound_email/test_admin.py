"""Admin: quarantined mail shown escaped, raw source downloadable, actions call services."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from model_bakery import baker

from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.poller import poll_once
from tests.support.admin_columns import columns_read
from tests.support.mail import build_mail, with_attachments
from tests.support.stores import FlakyStore

pytestmark = pytest.mark.django_db

HOSTILE = "Rating: 4\n<script>alert(1)</script><img src=http://tracker.example/p.gif>"


@pytest.fixture
def quarantined(folder_store, notification) -> InboundEmail:
    folder_store.put("q", build_mail(token=notification.token, body=HOSTILE))
    poll_once(store=FlakyStore(folder_store, failing={"q": False}))  # a permanent error
    row = InboundEmail.objects.get()
    assert row.status == "quarantined" and row.quarantine_key == "quarantine/q"
    return row


@pytest.fixture
def rejected(folder_store, notification) -> InboundEmail:
    mail = build_mail(
        token=notification.token,
        sender="mallory@evil.example",
        subject="<b>hi</b>",
        body=HOSTILE,
    )
    folder_store.put("r", mail)
    poll_once()
    return InboundEmail.objects.get(store_key="r")


def test_changelist_filters_by_status(admin_client, quarantined):
    url = reverse("admin:inbound_email_inboundemail_changelist")
    response = admin_client.get(url, {"status__exact": "quarantined"})
    assert response.status_code == 200
    assert "q" in response.content.decode()
    empty = admin_client.get(url, {"status__exact": "processed"})
    assert "0 inbound emails" in empty.content.decode()


def test_mail_is_shown_escaped(admin_client, rejected):
    url = reverse("admin:inbound_email_inboundemail_change", args=[rejected.pk])
    html = admin_client.get(url).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)" not in html
    assert "<img src=http://tracker.example" not in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html
    assert "sender_mismatch" in html or "Sender is not the notified address" in html


def test_quarantined_mail_shows_reason_and_traceback(admin_client, quarantined):
    url = reverse("admin:inbound_email_inboundemail_change", args=[quarantined.pk])
    html = admin_client.get(url).content.decode()
    assert "simulated failure on q" in html and "Traceback" in html


def test_raw_source_is_downloaded_not_rendered(admin_client, quarantined, folder_store):
    url = reverse("admin:inbound_email_inboundemail_raw", args=[quarantined.pk])
    response = admin_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response.content == folder_store.get("quarantine/q")


def test_reprocess_action_puts_the_mail_back_and_the_next_poll_handles_it(
    admin_client, quarantined, folder_store
):
    url = reverse("admin:inbound_email_inboundemail_changelist")
    admin_client.post(url, {"action": "reprocess", "_selected_action": [quarantined.pk]})
    quarantined.refresh_from_db()
    assert (quarantined.status, quarantined.attempts) == ("received", 0)
    assert folder_store.exists("q")

    poll_once()  # the real store this time

    quarantined.refresh_from_db()
    assert quarantined.status == "awaiting_relay"  # accepted; its instruction is being relayed
    assert quarantined.reply.rating == 4


def test_discard_action_drops_the_stored_copy(admin_client, quarantined, folder_store):
    url = reverse("admin:inbound_email_inboundemail_changelist")
    chosen = {"action": "discard", "_selected_action": [quarantined.pk]}
    admin_client.post(url, {**chosen, "post": "yes"})  # confirmed (see the test below)
    quarantined.refresh_from_db()
    assert quarantined.status == "discarded" and quarantined.raw is None
    assert not folder_store.exists("quarantine/q")


def test_processed_mail_cannot_be_reprocessed(admin_client, folder_store, notification):
    folder_store.put("p", build_mail(token=notification.token, body="5"))
    poll_once()
    row = InboundEmail.objects.get()
    url = reverse("admin:inbound_email_inboundemail_changelist")
    response = admin_client.post(
        url, {"action": "reprocess", "_selected_action": [row.pk]}, follow=True
    )
    assert "only quarantined or rejected" in response.content.decode()
    row.refresh_from_db()
    assert row.status == "processed"


def _staff(client, username: str, *codenames: str):
    """A logged-in staff user (not a superuser) holding exactly `codenames`."""
    user = baker.make("auth.User", username=username, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return user


def test_raw_download_needs_the_view_permission(client, quarantined, folder_store):
    """Staff who may not view inbound mail get 403 on its raw source; the admin site itself
    only asks for is_staff, so the download view must check the model's view permission."""
    user = _staff(client, "replies-only", "view_reply")
    url = reverse("admin:inbound_email_inboundemail_raw", args=[quarantined.pk])

    response = client.get(url)

    assert response.status_code == 403
    assert b"Rating: 4" not in response.content
    # The control: the same user allowed to view inbound mail downloads it.
    user.user_permissions.add(Permission.objects.get(codename="view_inboundemail"))
    allowed = client.get(url)
    assert allowed.status_code == 200
    assert allowed.content == folder_store.get("quarantine/q")


def test_view_only_staff_neither_see_nor_can_use_reprocess_or_discard(
    client, quarantined, folder_store
):
    """On a quarantined mail whose stored copy exists (so both actions would succeed), a
    view-only user is offered neither action and a forged POST of either changes nothing."""
    user = _staff(client, "viewer", "view_inboundemail")
    changelist = reverse("admin:inbound_email_inboundemail_changelist")

    html = client.get(changelist).content.decode()
    assert 'value="reprocess"' not in html and 'value="discard"' not in html
    assert "quarantine" in html  # the mail itself is listed: the page is the real one
    for action in ("reprocess", "discard"):
        client.post(changelist, {"action": action, "_selected_action": [quarantined.pk]})
        row = InboundEmail.objects.get(pk=quarantined.pk)
        assert (row.status, row.attempts) == ("quarantined", quarantined.attempts), action
        assert folder_store.exists("quarantine/q")

    # The control: with the change permission the same POST reprocesses it.
    user.user_permissions.add(Permission.objects.get(codename="change_inboundemail"))
    assert 'value="reprocess"' in client.get(changelist).content.decode()
    client.post(changelist, {"action": "reprocess", "_selected_action": [quarantined.pk]})
    quarantined.refresh_from_db()
    assert (quarantined.status, quarantined.attempts) == ("received", 0)


def _operator_reply(folder_store, notification) -> Reply:
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim."))
    poll_once()
    Reply.objects.update(needs_operator=True, relay_last_error="channel_not_found")
    return Reply.objects.get()


def test_operator_acknowledges_a_needs_operator_reply_in_the_admin(
    folder_store, notification, admin_client
):
    """R6: `needs_operator` could never be cleared, so the alarm fired forever."""
    reply = _operator_reply(folder_store, notification)
    response = admin_client.post(
        reverse("admin:inbound_email_reply_changelist"),
        {"action": "acknowledge", "_selected_action": [reply.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "1 reply(ies) acknowledged" in response.content.decode()
    reply.refresh_from_db()
    assert reply.operator_acknowledged_at is not None
    assert reply.needs_operator  # the history stays: it did need an operator


def test_acknowledge_needs_the_change_permission(folder_store, notification, client):
    """R6: a staff user with only the view permission cannot acknowledge."""
    reply = _operator_reply(folder_store, notification)
    viewer = baker.make("auth.User", username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_reply"))
    client.force_login(viewer)
    response = client.post(
        reverse("admin:inbound_email_reply_changelist"),
        {"action": "acknowledge", "_selected_action": [reply.pk]},
    )
    assert response.status_code in (200, 302)
    reply.refresh_from_db()
    assert reply.operator_acknowledged_at is None


def test_reply_shows_the_text_that_was_not_relayed_escaped(
    admin_client, folder_store, notification
):
    """Issue 10.6: what the reply parser stripped is shown to operators, read-only."""
    body = "Please add Kim.\n\n__\nAlso <script>alert(1)</script> cut section 3."
    folder_store.put("m", build_mail(token=notification.token, body=body))
    poll_once()
    reply = Reply.objects.get()

    html = admin_client.get(reverse("admin:inbound_email_reply_change", args=[reply.pk])).content
    html = html.decode()

    assert "Also &lt;script&gt;alert(1)&lt;/script&gt; cut section 3." in html
    assert "<script>alert(1)" not in html
    assert 'name="stripped_text"' not in html  # read-only, not a form field


def test_an_attachment_is_downloaded_not_rendered_and_needs_the_view_permission(
    admin_client, client, folder_store, notification, settings
):
    """Issue 21.1: the inbox links each attachment to its download here. A sender's HTML or
    SVG is saved, never shown in the admin's origin; a staff user without the view
    permission gets nothing; one kept only in the raw mail points to the raw download."""
    settings.INBOUND_EMAIL_MAX_ATTACHMENT_BYTES = 2048
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    attach = with_attachments(
        pdf_name=None, extra=[("x.svg", svg, "image/svg+xml"), ("big.bin", b"0" * 4096, "a/b")]
    )
    folder_store.put("a", build_mail(token=notification.token, body="See.", attach=attach))
    poll_once()
    stored, big = ReplyAttachment.objects.order_by("index")

    url = reverse("admin:inbound_email_replyattachment_download", args=[stored.pk])
    response = admin_client.get(url)
    assert response.status_code == 200 and response.content == svg
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == 'attachment; filename="x.svg"'
    assert response["X-Content-Type-Options"] == "nosniff"

    staff = baker.make("auth.User", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403

    missing = admin_client.get(
        reverse("admin:inbound_email_replyattachment_download", args=[big.pk])
    )
    assert missing.status_code == 404 and b"Kept in raw, too large" in missing.content
    page = admin_client.get(
        reverse("admin:inbound_email_replyattachment_change", args=[big.pk])
    ).content.decode()
    raw = reverse("admin:inbound_email_inboundemail_raw", args=[big.reply.inbound_email_id])
    assert raw in page


def test_the_changelist_never_loads_the_mail_bodies_or_errors(admin_client, quarantined):
    """Issue 22: the list shows a few short fields; the raw source, decoded bodies and the
    last error load only on a mail's own page (the raw source only for its download)."""
    url = reverse("admin:inbound_email_inboundemail_changelist")
    large = ["raw", "body_text", "headers_text", "last_error"]
    assert columns_read(admin_client, url, "inbound_email_inboundemail", large) == set()


# --- the quarantined mail's page (issue 20, point 7) ----------------------------------------


def _quarantine(folder_store, notification, key: str, **mail) -> InboundEmail:
    folder_store.put(key, build_mail(token=notification.token, **mail))
    poll_once(store=FlakyStore(folder_store, failing={key: False}))  # a permanent error
    return InboundEmail.objects.get(store_key=key)


def test_quarantined_mail_page_reads_its_headers_from_the_raw_escaped_with_reason_in_words(
    admin_client, folder_store, notification
):
    """It showed From/To/Subject as "-" (a quarantined mail was never parsed into the row),
    printed a raw traceback, and had no buttons."""
    from tests.support.mail import PI_ADDRESS

    row = _quarantine(folder_store, notification, "h", subject="<img src=x onerror=alert(1)>")
    assert (row.from_address, row.subject) == ("", "")  # nothing in the row to show

    html = admin_client.get(reverse("admin:inbound_email_inboundemail_change", args=[row.pk]))
    html = html.content.decode()
    summary = html[html.index('id="mail-summary"') :].split("</div>")[0]
    assert f'id="mail-from">{PI_ADDRESS}</dd>' in summary
    assert "reply" in summary.split('id="mail-to">')[1].split("</dd>")[0]
    assert 'id="mail-subject">&lt;img src=x onerror=alert(1)&gt;</dd>' in summary
    assert "<img src=x" not in html
    assert 'id="mail-date">20' in summary
    assert f'id="mail-reason">Quarantined: {row.get_reason_display()}</strong>' in summary
    # The traceback is folded away under its last line.
    assert '<details class="traceback"><summary>' in html
    assert "simulated failure on h" in html
    for verb in ("reprocess", "discard"):
        url = reverse(f"admin:inbound_email_inboundemail_{verb}", args=[row.pk])
        assert f'action="{url}"' in summary
    assert reverse("admin:inbound_email_inboundemail_raw", args=[row.pk]) in summary


def test_reprocess_and_discard_buttons_act_on_the_one_mail_and_are_audited(
    admin_client, folder_store, notification
):
    from django.contrib.admin.models import LogEntry

    first = _quarantine(folder_store, notification, "a")
    second = _quarantine(folder_store, notification, "b")
    admin_client.post(reverse("admin:inbound_email_inboundemail_reprocess", args=[first.pk]))
    admin_client.post(
        reverse("admin:inbound_email_inboundemail_discard", args=[second.pk]), {"confirm": "yes"}
    )
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == ("received", "discarded")
    messages = sorted(e.get_change_message() for e in LogEntry.objects.all())
    assert messages == ["discarded", "queued for reprocessing"]


def test_discard_action_asks_for_confirmation_first(admin_client, quarantined, folder_store):
    """Issue 31.6: Discard deletes the stored copies for good, so, as Django's delete does, it
    shows what it will discard and acts only once that page is confirmed."""
    url = reverse("admin:inbound_email_inboundemail_changelist")
    chosen = {"action": "discard", "_selected_action": [quarantined.pk]}
    response = admin_client.post(url, chosen)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Are you sure" in page and quarantined.store_key in page
    assert f'name="_selected_action" value="{quarantined.pk}"' in page
    assert 'name="post" value="yes"' in page and 'name="action" value="discard"' in page
    quarantined.refresh_from_db()
    assert quarantined.status == "quarantined" and folder_store.exists("quarantine/q")

    response = admin_client.post(url, {**chosen, "post": "yes"}, follow=True)
    assert "1 mail(s) discarded" in response.content.decode()
    quarantined.refresh_from_db()
    assert quarantined.status == "discarded" and not folder_store.exists("quarantine/q")


def test_discard_button_asks_for_confirmation_first(admin_client, quarantined, folder_store):
    from django.contrib.admin.models import LogEntry

    url = reverse("admin:inbound_email_inboundemail_discard", args=[quarantined.pk])
    response = admin_client.post(url)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Are you sure" in page and quarantined.store_key in page
    assert f'action="{url}"' in page and 'name="confirm" value="yes"' in page
    change = reverse("admin:inbound_email_inboundemail_change", args=[quarantined.pk])
    assert f'href="{change}"' in page  # "No, take me back"
    quarantined.refresh_from_db()
    assert quarantined.status == "quarantined" and not LogEntry.objects.exists()

    response = admin_client.post(url, {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == change
    quarantined.refresh_from_db()
    assert quarantined.status == "discarded" and not folder_store.exists("quarantine/q")
    assert [e.get_change_message() for e in LogEntry.objects.all()] == ["discarded"]


def test_mail_buttons_need_the_change_permission(client, django_user_model, quarantined):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_inboundemail"))
    client.force_login(user)
    html = client.get(reverse("admin:inbound_email_inboundemail_change", args=[quarantined.pk]))
    assert "Reprocess</button>" not in html.content.decode()
    for verb in ("reprocess", "discard"):
        url = reverse(f"admin:inbound_email_inboundemail_{verb}", args=[quarantined.pk])
        assert client.post(url).status_code == 403
    quarantined.refresh_from_db()
    assert quarantined.status == "quarantined"


def test_replies_list_shows_an_ordinary_no_as_plain_text_not_a_red_cross(admin_client):
    """Issue 20: a reply that needs no operator is the normal case; the list drew Django's
    red "✗" icon (icon-no.svg) for it, as for an error. Now the words "no" and "yes"."""
    notification = baker.make("notifications.EmailNotification", status="pending")
    for i, needs in enumerate((False, True)):
        baker.make(
            Reply,
            notification=notification,
            inbound_email=baker.make(InboundEmail, store_key=f"inbound/{i}", status="processed"),
            needs_operator=needs,
        )
    page = admin_client.get(reverse("admin:inbound_email_reply_changelist")).content.decode()
    assert "icon-no.svg" not in page and "icon-yes.svg" not in page
    cells = page.split('class="field-needs_operator_text"')[1:]
    assert sorted(cell.split(">", 1)[1].split("<", 1)[0] for cell in cells) == ["no", "yes"]
    assert ">Needs operator<" in page or ">needs operator<" in page.lower()


def test_a_mail_quarantined_past_a_header_limit_shows_its_headers_in_the_summary(
    admin_client, folder_store, notification
):
    """Issue 36.8: the summary read From/To/Subject/Date with the intake's limits, which this
    mail is past: it showed "—" for each, which the headers below showed, and "the stored
    mail could not be read" while the page showed it. It reads the headers shown below."""
    from notifications.reply_address import reply_address_for
    from tests.support.mail import PI_ADDRESS

    many = {f"X-Relay-Hop-{n}": f"hop {n}" for n in range(1100)}  # past max_headers (1000)
    folder_store.put(
        "many",
        build_mail(token=notification.token, subject="Re: budget <ok>", headers=many),
    )
    poll_once()
    row = InboundEmail.objects.get(store_key="many")
    assert (row.status, row.reason) == ("quarantined", "header_count_limit")
    assert (row.from_address, row.subject) == ("", "")  # the parser stopped at the limit

    page = admin_client.get(reverse("admin:inbound_email_inboundemail_change", args=[row.pk]))
    html = page.content.decode()
    summary = html[html.index('id="mail-summary"') :].split("</div>")[0]
    assert f'id="mail-from">{PI_ADDRESS}</dd>' in summary
    assert f'id="mail-to">{reply_address_for(notification.token)}</dd>' in summary
    assert 'id="mail-subject">Re: budget &lt;ok&gt;</dd>' in summary
    assert 'id="mail-date">20' in summary and " UTC</dd>" in summary
    assert "could not be read" not in html
    assert "Read from the headers shown below" in summary
    assert "X-Relay-Hop-1099: hop 1099" in html  # the headers below: the same text


def test_the_summary_says_the_mail_could_not_be_read_only_when_it_could_not(
    admin_client, folder_store
):
    """A row with nothing parsed and no preview, whose stored copy is gone: the one case
    where the summary has nothing to read, and says why."""
    row = baker.make(
        InboundEmail,
        store_key="gone",
        status=InboundEmail.Status.QUARANTINED,
        raw=None,
        quarantine_key="quarantine/gone",
        headers_text="",
    )
    html = admin_client.get(
        reverse("admin:inbound_email_inboundemail_change", args=[row.pk])
    ).content.decode()
    summary = html[html.index('id="mail-summary"') :].split("</div>")[0]
    assert "The stored mail could not be read: " in summary and "Read from" not in summary
    assert 'id="mail-from">—</dd>' in summary
