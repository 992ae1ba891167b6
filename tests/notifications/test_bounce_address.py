"""Issue 28.5 and 28.2: no public token proves a bounce, and one bounce counts once.

A report (DSN or ARF) counts only when it reaches the notification's envelope sender, a
per-notification address (VERP) that is in no part of the message: whoever holds a copy of
the mail (forwarded, or shown by the unsubscribe link) cannot forge one. And a bounce that
SES reports through SNS and the receiving server reports as a DSN is one bounce."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from inbound_email import stores
from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once
from inbound_email.stores import FolderStore, store_from_url
from notifications.bounce_address import BOUNCE_REPORT_DAYS
from notifications.models import (
    DeliveryFeedback,
    EmailNotification,
    Suppression,
    UnsubscribeRevocation,
)
from notifications.sweeps import sweep_new_proposals
from tests.support import delivery_reports as reports
from tests.support.sns import ses_bounce

GONE = "gone.pi@example.net"
BASE = "https://assistant.example.org"


@pytest.fixture
def folder_store(settings, tmp_path) -> FolderStore:
    stores._default_cache.clear()
    settings.SLACK_BOT_TOKEN = ""
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "mail")
    store = store_from_url()
    assert isinstance(store, FolderStore)
    yield store
    stores._default_cache.clear()


@pytest.fixture
def locmem(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.PUBLIC_BASE_URL = BASE


def _mail_one(make_pi, **fields):
    pi = make_pi(email=GONE, **fields)
    assert sweep_new_proposals(now=timezone.now()).sent == 1
    return pi, EmailNotification.objects.get(user=pi)


def _forwarded(message) -> str:
    """What a forwarded copy shows: the body, its links, and the headers a forward quotes."""
    shown = ("From", "To", "Date", "Subject", "Reply-To", "List-Unsubscribe", "Message-ID")
    raw = message.message()
    quoted = "\n".join(f"{name}: {raw[name]}" for name in shown if raw[name])
    return f"{quoted}\n\n{raw.as_string()}"


@pytest.mark.django_db(transaction=True)
def test_the_envelope_sender_is_per_notification_and_nowhere_in_the_message(make_pi, locmem):
    pi, row = _mail_one(make_pi)
    [message] = mail.outbox
    envelope = message.from_email
    assert message.message()["From"] == "Proposal Assistant <assistant@localhost>"
    assert envelope != "Proposal Assistant <assistant@localhost>"
    assert re.fullmatch(rf"replies\+bounce-{row.pk}-[0-9a-f]{{24}}@reply\.localhost", envelope)
    secret_part = envelope.split("+", 1)[1].split("@")[0]
    raw = message.message().as_bytes()
    assert secret_part.encode() not in raw  # not in the body, a link, Reply-To or any header
    assert row.token.encode() in raw  # (the reply token is, as it must be)


@pytest.mark.django_db(transaction=True)
def test_a_report_to_the_envelope_sender_counts(make_pi, locmem, folder_store):
    """Gmail's DSN goes to the envelope sender; it quotes no token at all."""
    pi, row = _mail_one(make_pi)
    envelope = mail.outbox[0].from_email
    folder_store.put("bounce-1", reports.addressed_to(reports.gmail_hard_bounce(GONE), envelope))
    poll_once()
    assert InboundEmail.objects.get().reason == "bounce"
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.reason) == (GONE, "hard_bounce")


@pytest.mark.django_db(transaction=True)
def test_a_report_to_the_envelope_sender_past_the_window_does_not_count(
    make_pi, locmem, folder_store
):
    """A bounce comes within days of the send; past BOUNCE_REPORT_DAYS the address proves
    nothing (what a copy forwarded with all its headers could still show, expires)."""
    pi, row = _mail_one(make_pi)
    EmailNotification.objects.filter(pk=row.pk).update(
        sent_at=timezone.now() - BOUNCE_REPORT_DAYS - timedelta(hours=1)
    )
    envelope = mail.outbox[0].from_email
    folder_store.put("late", reports.addressed_to(reports.gmail_hard_bounce(GONE), envelope))
    poll_once()
    assert "not recorded" in InboundEmail.objects.get().detail
    assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_forged_report_built_from_a_forwarded_copy_suppresses_nothing(
    make_pi, locmem, folder_store, client
):
    """Everything a forwarded copy shows (the body, the one-click link, the reply address, the
    subject, the quoted headers), put into DSNs and an ARF report sent from a mailer-daemon
    address to every address the copy names: none suppresses the PI, before or after the
    operator revokes the link."""
    pi, row = _mail_one(make_pi)
    copy = _forwarded(mail.outbox[0])
    link = re.search(r"<(https://[^>]+)>", mail.outbox[0].extra_headers["List-Unsubscribe"])[1]
    targets = ["replies@reply.localhost", f"replies+{row.token}@reply.localhost"]
    for n, target in enumerate(targets):
        gmail = reports.gmail_hard_bounce(GONE, row.token).replace(
            b"** Address not found **", f"{link}\n{copy}".encode()
        )
        folder_store.put(f"forged-dsn-{n}", reports.addressed_to(gmail, target))
        arf = reports.arf_complaint(GONE, row.token)
        folder_store.put(f"forged-arf-{n}", reports.addressed_to(arf, target))
    poll_once()
    assert set(InboundEmail.objects.values_list("reason", flat=True)) == {"bounce"}
    assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()

    UnsubscribeRevocation.objects.create(notification=row, reason="forwarded to a list")
    assert client.post(link.removeprefix(BASE)).status_code == 404
    folder_store.put("forged-after-revocation", reports.gmail_hard_bounce(GONE, row.token))
    poll_once()
    assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_report_to_another_notifications_envelope_sender_counts_for_nobody_else(
    make_pi, locmem, folder_store
):
    """The envelope sender of a mail to one PI proves nothing about another address."""
    other = make_pi(email="other@example.net")
    assert sweep_new_proposals(now=timezone.now()).sent == 1
    envelope = mail.outbox[0].from_email
    assert EmailNotification.objects.get(user=other).to_address == "other@example.net"
    folder_store.put("cross", reports.addressed_to(reports.gmail_hard_bounce(GONE), envelope))
    tampered = envelope.replace("-", "-1", 1)  # another id, same MAC
    folder_store.put("tampered", reports.addressed_to(reports.gmail_hard_bounce(GONE), tampered))
    poll_once()
    assert not DeliveryFeedback.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_ses_sends_from_the_bounce_address_without_showing_it(make_pi, ses):
    pi, row = _mail_one(make_pi)
    [sent] = ses.messages
    assert re.fullmatch(rf"replies\+bounce-{row.pk}-[0-9a-f]{{24}}@reply\.localhost", sent.source)
    assert sent.source.split("+", 1)[1].split("@")[0] not in sent.raw_data


@pytest.mark.django_db(transaction=True)
def test_one_bounce_reported_by_sns_and_by_dsn_counts_once(
    make_pi, ses, signer, folder_store, client
):
    """Two mails to a PI bounce softly, each reported twice (SES event through SNS, and the
    DSN forwarded to the envelope sender): two soft bounces, not four, so the address is not
    suppressed; a third bounce (a third mail) is the third and suppresses it for 7 days."""
    pi = make_pi(email=GONE, proposals=3)
    assert sweep_new_proposals(now=timezone.now()).sent == 3
    rows = list(EmailNotification.objects.filter(user=pi).order_by("pk"))
    sources = {message.id: message.source for message in ses.messages}
    by_id = {row.ses_message_id: row for row in rows}
    assert set(by_id) == set(sources)

    def bounce_twice(row, n):
        event = ses_bounce(GONE, "Transient")
        event["mail"]["messageId"] = row.ses_message_id
        response = client.post(
            "/ses/events",
            data=json.dumps(signer.notification(event)),
            content_type="text/plain; charset=UTF-8",
        )
        assert response.status_code == 200, response.content
        dsn = reports.postfix_soft_bounce(GONE, row.token)
        folder_store.put(f"dsn-{n}", reports.addressed_to(dsn, sources[row.ses_message_id]))
        poll_once()

    bounce_twice(rows[0], 0)
    bounce_twice(rows[1], 1)
    assert DeliveryFeedback.objects.filter(address=GONE, kind="soft_bounce").count() == 2
    assert not Suppression.objects.exists()
    bounce_twice(rows[2], 2)
    assert DeliveryFeedback.objects.filter(address=GONE, kind="soft_bounce").count() == 3
    assert Suppression.objects.get().reason == "soft_bounces"


@pytest.mark.django_db(transaction=True)
def test_a_report_to_a_real_notifications_id_with_a_made_up_mac_records_nothing(
    make_pi, locmem, folder_store
):
    """The id is a real one (the PI's own notification) and the report names the PI: only the
    MAC tells a forger, who knows the id scheme, from the mail system. Any 24 hex digits
    but the right ones suppress nothing (issue 36.4: no test held the MAC check)."""
    pi, row = _mail_one(make_pi)
    envelope = mail.outbox[0].from_email
    real_mac = re.fullmatch(
        rf"replies\+bounce-{row.pk}-([0-9a-f]{{24}})@reply\.localhost", envelope
    )[1]
    made_up = ["0" * 24, "f" * 24, real_mac[:-1] + ("0" if real_mac[-1] != "0" else "1")]
    for n, mac in enumerate(made_up):
        forged = f"replies+bounce-{row.pk}-{mac}@reply.localhost"
        folder_store.put(
            f"forged-{n}", reports.addressed_to(reports.gmail_hard_bounce(GONE), forged)
        )
    poll_once()
    assert InboundEmail.objects.count() == len(made_up)
    assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()


OLD_KEY = "old-key-" + "k3Yq9vR2xW7mB4nT8pL1sD6fG0hJ5cZ" * 2
NEW_KEY = "new-key-" + "Qa8Wn3Ez6Rx1Tc4Yv7Ub0Im2Ol5Pk9J" * 2


@pytest.mark.parametrize(
    "fallbacks, counts", [([OLD_KEY], True), ([], False)], ids=["a_fallback", "dropped"]
)
@pytest.mark.django_db(transaction=True)
def test_a_report_signed_with_a_rotated_key_counts_while_the_key_is_a_fallback(
    make_pi, locmem, folder_store, settings, fallbacks, counts
):
    """Mail sent under the old SECRET_KEY, then the key rotated: a bounce of it counts while
    the old key is in SECRET_KEY_FALLBACKS, and records nothing once it was dropped."""
    settings.SECRET_KEY = OLD_KEY
    pi, row = _mail_one(make_pi)
    envelope = mail.outbox[0].from_email
    settings.SECRET_KEY = NEW_KEY
    settings.SECRET_KEY_FALLBACKS = fallbacks
    folder_store.put("late", reports.addressed_to(reports.gmail_hard_bounce(GONE), envelope))
    poll_once()
    assert InboundEmail.objects.get().reason == "bounce"
    if counts:
        assert DeliveryFeedback.objects.get().address == GONE
        assert Suppression.objects.get().reason == "hard_bounce"
    else:
        assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()
