"""A word back to the PI (issue 13 point 3): a reply rejected for a reason the PI can act on
queues one notice to the notified address, recorded on the mail's row; no other rejection
does, and a notification gets at most one notice an hour. Through the poller, on real rows;
the notice's sending is `tests/notifications/test_notices.py`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail as django_mail
from django.utils import timezone

from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once
from notifications.models import EmailNotification
from notifications.notices import notices_send
from tests.support.mail import PI_ADDRESS, build_mail
from tests.support.stores import key

Status = InboundEmail.Status
Reason = InboundEmail.Reason
Kind = EmailNotification.Kind

_names = iter(range(1, 1_000_000))


def poll_mail(store, raw: bytes) -> InboundEmail:
    name = key(store, f"mail-{next(_names)}")
    store.put(name, raw)
    poll_once(store=store)
    return InboundEmail.objects.get(store_key=name)


def notices() -> list[EmailNotification]:
    return list(EmailNotification.objects.filter(kind=Kind.REPLY_REJECTED).order_by("pk"))


# --- reasons that get a notice ----------------------------------------------------------------


def _invalid_rating(store, notification):
    return build_mail(token=notification.token, body="Rating: seven")


def _empty_reply(store, notification):
    return build_mail(token=notification.token, body="")


def _rate_limited(store, notification, settings):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1
    first = poll_mail(store, build_mail(token=notification.token, body="4"))
    assert first.status == Status.PROCESSED
    return build_mail(token=notification.token, body="5")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reason", "setup"),
    [
        (Reason.INVALID_RATING, {}),
        (Reason.EMPTY_REPLY, {}),
        (Reason.EXPIRED_TOKEN, {"expires_at": "past"}),
        (Reason.RATE_LIMITED, {}),
        (Reason.NO_PROPOSAL, {"kind": Kind.DIGEST}),
    ],
)
def test_a_fixable_rejection_queues_one_notice_to_the_notified_address(
    folder_store, make_notification, settings, reason, setup
):
    fields = dict(setup)
    if fields.get("expires_at") == "past":
        fields["expires_at"] = timezone.now() - timedelta(minutes=5)
    notification = make_notification(**fields)
    if reason == Reason.NO_PROPOSAL:  # a digest answers no single proposal
        notification.proposal = None
        notification.save()
    notification.user.email = "changed-since@university.example"  # the user's address now
    notification.user.save()
    if reason == Reason.RATE_LIMITED:
        raw = _rate_limited(folder_store, notification, settings)
    elif reason == Reason.INVALID_RATING:
        raw = _invalid_rating(folder_store, notification)
    elif reason == Reason.EMPTY_REPLY:
        raw = _empty_reply(folder_store, notification)
    else:
        raw = build_mail(token=notification.token, body="4\nmore budget please")

    row = poll_mail(folder_store, raw)

    assert (row.status, row.reason) == (Status.REJECTED, reason)
    [notice] = notices()
    assert row.rejection_notice == notice  # recorded on the mail's row
    assert notice.about == notification
    assert notice.notice_reason == reason
    assert notice.to_address == PI_ADDRESS  # the notified address, not the user's current one
    assert notice.status == EmailNotification.Status.PENDING  # sent by the sender path

    summary = notices_send()

    assert summary.sent == 1
    [message] = django_mail.outbox
    assert message.to == [PI_ADDRESS]


# --- rejections that never get one ------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reason", "mail_kwargs"),
    [
        (Reason.AUTO_REPLY, {"headers": {"Auto-Submitted": "auto-replied"}, "body": ""}),
        (Reason.AUTO_REPLY, {"subject": "Out of Office: back Monday", "body": "Rating: x"}),
        (Reason.BOUNCE, {"sender": "mailer-daemon@university.example", "body": ""}),
        (Reason.SENDER_MISMATCH, {"sender": "someone-else@university.example", "body": ""}),
    ],
    ids=["auto-submitted", "out-of-office", "bounce", "sender-mismatch"],
)
def test_no_notice_for_a_mail_that_is_not_the_pis_own_answer(
    folder_store, notification, reason, mail_kwargs
):
    row = poll_mail(folder_store, build_mail(token=notification.token, **mail_kwargs))

    assert (row.status, row.reason) == (Status.REJECTED, reason)
    assert row.rejection_notice is None
    assert notices() == []
    assert notices_send().sent == 0 and django_mail.outbox == []


@pytest.mark.django_db
def test_no_notice_for_an_unknown_or_missing_token(folder_store, notification):
    unknown = poll_mail(folder_store, build_mail(token="f" * 32, body=""))
    missing = poll_mail(folder_store, build_mail(body=""))

    assert (unknown.reason, missing.reason) == (Reason.UNKNOWN_TOKEN, Reason.NO_TOKEN)
    assert notices() == []


@pytest.mark.django_db
def test_no_notice_for_a_failed_dmarc_or_spf_and_dkim_check(folder_store, notification, settings):
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = True
    forged = build_mail(token=notification.token, body="Rating: seven")
    dmarc = poll_mail(folder_store, b"X-SES-DMARC-Verdict: FAIL\r\n" + forged)
    spf_dkim = poll_mail(
        folder_store,
        b"X-SES-SPF-Verdict: FAIL\r\nX-SES-DKIM-Verdict: FAIL\r\n"
        + build_mail(token=notification.token, body=""),
    )

    assert {dmarc.reason, spf_dkim.reason} == {Reason.UNAUTHENTICATED_SENDER}
    assert notices() == []


@pytest.mark.django_db
def test_no_notice_for_a_quarantined_mail(folder_store, notification, settings):
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = True
    virus = poll_mail(
        folder_store,
        b"X-SES-Virus-Verdict: FAIL\r\n" + build_mail(token=notification.token, body="x"),
    )
    settings.INBOUND_EMAIL_MAX_TEXT_BYTES = 1024
    too_long = poll_mail(
        folder_store, build_mail(token=notification.token, body="Rating: x\n" + "y" * 5000)
    )

    assert (virus.status, virus.reason) == (Status.QUARANTINED, Reason.VIRUS)
    assert (too_long.status, too_long.reason) == (Status.QUARANTINED, Reason.TEXT_SIZE_LIMIT)
    assert notices() == []


@pytest.mark.django_db
def test_no_notice_about_a_notice(folder_store, notification):
    """A notice's own token is never advertised; a mail to it anyway gets no notice back."""
    poll_mail(folder_store, build_mail(token=notification.token, body="Rating: seven"))
    [notice] = notices()
    notices_send()
    row = poll_mail(folder_store, build_mail(token=notice.token, body="Rating: eight"))

    assert (row.status, row.reason) == (Status.REJECTED, Reason.EXPIRED_TOKEN)
    assert row.rejection_notice is None
    assert notices() == [notice]


# --- at most one per notification per hour -----------------------------------------------------


@pytest.mark.django_db
def test_at_most_one_notice_per_notification_per_hour(
    folder_store, notification, make_notification
):
    first = poll_mail(folder_store, build_mail(token=notification.token, body="Rating: seven"))
    second = poll_mail(folder_store, build_mail(token=notification.token, body=""))
    other = make_notification()  # another notification of the same PI has its own hour
    third = poll_mail(folder_store, build_mail(token=other.token, body=""))

    assert first.rejection_notice is not None
    assert second.reason == Reason.EMPTY_REPLY and second.rejection_notice is None
    assert third.rejection_notice is not None
    assert len(notices()) == 2

    # An hour later the PI may be told again.
    EmailNotification.objects.filter(pk=first.rejection_notice.pk).update(
        created_at=timezone.now() - timedelta(minutes=61)
    )
    fourth = poll_mail(folder_store, build_mail(token=notification.token, body=""))
    assert fourth.rejection_notice is not None
    assert fourth.rejection_notice.about == notification
    assert len(notices()) == 3


@pytest.mark.django_db
def test_an_accepted_reply_gets_no_notice(folder_store, notification):
    row = poll_mail(folder_store, build_mail(token=notification.token, body="4"))
    assert row.status == Status.PROCESSED and row.rejection_notice is None
    assert notices() == []
