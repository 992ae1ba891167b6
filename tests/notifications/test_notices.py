"""Rejection notices (issue 13 point 3): created capped at one per answered notification per
hour, sent by the claim -> commit -> send -> record path (I12: no phantom send, none lost), to
the notified address, answering to the notification they are about.

Which rejections get a notice is tested through the poller in
`tests/inbound_email/services/test_notices.py`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone
from model_bakery import baker

from notifications.emails import unsubscribe_header
from notifications.models import EmailNotification
from notifications.notices import notice_reply_rejected, notices_send
from notifications.reply_address import reply_address_for
from notifications.selectors import notification_is_open_for_replies
from notifications.senders.base import OutgoingEmail

Kind = EmailNotification.Kind
Status = EmailNotification.Status

NOTIFIED = "pi@university.example"


@pytest.fixture
def answered(make_pi):
    """A sent review request whose reply was rejected; the user's address has changed since."""
    pi = make_pi(first_name="Ada", last_name="Lovelace", email="new-address@example.org")
    now = timezone.now()
    return baker.make(
        EmailNotification,
        user=pi,
        proposal=pi.proposals.get(),
        kind=Kind.PROPOSAL_REVIEW,
        status=Status.SENT,
        to_address=NOTIFIED,
        sent_at=now - timedelta(hours=1),
        ses_message_id="0100-ses-1",
        expires_at=now + timedelta(days=3),
    )


def queue(answered, reason="invalid_rating", now=None):
    return notice_reply_rejected(about=answered, reason=reason, now=now or timezone.now())


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reason", "says"),
    [
        ("invalid_rating", "whole number from 1 to 5"),
        ("empty_reply", "no rating and no instructions"),
        ("expired_token", "after replies to that email had closed"),
        ("rate_limited", "wait an hour"),
        ("no_proposal", "answered a digest"),
    ],
)
def test_a_notice_is_sent_once_to_the_notified_address_and_says_why(answered, reason, says):
    answered.proposal.title = "Tom & Jerry <3"
    answered.proposal.save()
    notice = queue(answered, reason)

    summary = notices_send()

    assert (summary.sent, summary.failed) == (1, 0)
    [message] = mail.outbox
    assert message.to == [NOTIFIED]  # not the user's current address, not the mail's From
    assert message.subject == "Your reply was not acted on: Tom & Jerry <3"  # not escaped
    assert says in message.body and "Hello Ada Lovelace" in message.body
    [(html, _)] = message.alternatives
    assert says in html and "Tom &amp; Jerry &lt;3" in html
    # Replying to the notice reaches the notification it is about; so does unsubscribing.
    assert message.reply_to == [reply_address_for(answered.token)]
    assert message.extra_headers["List-Unsubscribe"] == unsubscribe_header(
        answered.token, notification_id=notice.pk
    )
    assert message.extra_headers["X-Notification-Kind"] == "reply_rejected"

    notice.refresh_from_db()
    assert notice.status == Status.SENT and notice.attempts == 1
    assert message.extra_headers["Message-ID"] == f"<{notice.ses_message_id}>"
    # A notice takes no replies of its own.
    assert not notification_is_open_for_replies(notification=notice, now=timezone.now())
    assert notices_send().sent == 0
    assert len(mail.outbox) == 1


@pytest.mark.django_db
def test_at_most_one_notice_per_notification_per_hour(answered, make_pi):
    now = timezone.now()
    first = queue(answered, now=now)
    assert first is not None
    assert queue(answered, "empty_reply", now=now + timedelta(minutes=59)) is None
    later = queue(answered, "empty_reply", now=now + timedelta(minutes=61))
    assert later is not None and later.notice_reason == "empty_reply"
    assert EmailNotification.objects.filter(kind=Kind.REPLY_REJECTED).count() == 2


@pytest.mark.django_db
def test_a_notification_without_an_address_gets_no_notice(answered):
    answered.to_address = ""
    answered.save()
    assert queue(answered) is None
    assert not EmailNotification.objects.filter(kind=Kind.REPLY_REJECTED).exists()


class _CheckingSender:
    """The mail service's edge: records what the database held when the mail left."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def send(self, email: OutgoingEmail) -> str:
        row = EmailNotification.objects.get(kind=Kind.REPLY_REJECTED)
        self.seen.append((connection.in_atomic_block, row.status))
        return "0100-ses-notice"


@pytest.mark.django_db(transaction=True)
def test_the_claim_commits_before_the_mail_leaves(answered):
    queue(answered)
    sender = _CheckingSender()

    notices_send(sender=sender)

    assert sender.seen == [(False, Status.SENDING)]  # claimed, committed, then sent
    notice = EmailNotification.objects.get(kind=Kind.REPLY_REJECTED)
    assert (notice.status, notice.ses_message_id) == (Status.SENT, "0100-ses-notice")


@pytest.mark.django_db(transaction=True)
def test_a_refused_notice_stays_pending_with_no_phantom_send_then_goes_once(
    answered, ses_unverified
):
    notice = queue(answered)
    now = timezone.now()

    first = notices_send(now=now)

    notice.refresh_from_db()
    assert (first.sent, first.failed) == (0, 1)
    assert (notice.status, notice.ses_message_id, notice.attempts) == (Status.PENDING, "", 1)
    assert notice.retry_after > now
    assert notices_send(now=now).sent == 0  # not before its backoff

    ses_unverified.verify_sender()
    later = notices_send(now=notice.retry_after + timedelta(seconds=1))

    notice.refresh_from_db()
    assert later.sent == 1 and notice.status == Status.SENT and notice.attempts == 2
    assert ses_unverified.recipients() == [NOTIFIED]


@pytest.mark.django_db(transaction=True)
def test_a_claim_left_by_a_crashed_worker_is_reconciled_and_sent_once(answered, settings):
    notice = queue(answered)
    claimed_at = timezone.now() - timedelta(seconds=settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS + 1)
    EmailNotification.objects.filter(pk=notice.pk).update(
        status=Status.SENDING, claimed_at=claimed_at, attempts=1
    )

    summary = notices_send()

    assert (summary.reconciled, summary.sent) == (1, 1)
    notice.refresh_from_db()
    assert notice.status == Status.SENT and notice.attempts == 2
    assert [m.to for m in mail.outbox] == [[NOTIFIED]]
    assert notices_send().sent == 0
