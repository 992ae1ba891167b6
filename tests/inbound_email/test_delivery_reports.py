"""Issue 23.2: bounce and complaint reports reaching the inbound address are recognised before
reply parsing and suppress the address (they used to be rejected as replies, and the address
was mailed again on every sweep)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from model_bakery import baker

from inbound_email.delivery_reports import read_delivery_report
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from notifications.bounce_address import bounce_address_for
from notifications.models import (
    DeliveryFeedback,
    EmailNotification,
    Proposal,
    Suppression,
)
from notifications.sweeps import sweep_new_proposals
from tests.support import delivery_reports as reports

Kind = DeliveryFeedback.Kind
GONE = "gone.pi@example.net"


@pytest.mark.parametrize(
    ("build", "source", "kind"),
    [
        (reports.gmail_hard_bounce, "dsn", Kind.HARD_BOUNCE),
        (reports.outlook_hard_bounce, "dsn", Kind.HARD_BOUNCE),
        (reports.exim_hard_bounce, "dsn", Kind.HARD_BOUNCE),
        (reports.postfix_soft_bounce, "dsn", Kind.SOFT_BOUNCE),
        (reports.ses_hard_bounce, "dsn", Kind.HARD_BOUNCE),
        (reports.arf_complaint, "arf", Kind.COMPLAINT),
    ],
    ids=["gmail", "outlook", "exim", "postfix", "ses", "arf"],
)
def test_each_senders_report_names_the_address_and_the_kind(build, source, kind):
    report = read_delivery_report(build(GONE))
    assert report is not None
    assert report.source == source
    assert [(f.address, f.kind) for f in report.findings] == [(GONE, kind)]


def test_a_redacted_arf_report_names_the_recipient_of_the_returned_message():
    report = read_delivery_report(reports.arf_complaint(GONE, redacted=True))
    assert report is not None and [(f.address, f.kind) for f in report.findings] == [
        (GONE, Kind.COMPLAINT)
    ]


def test_a_delay_warning_and_a_plain_reply_are_no_bounce():
    delayed = reports.postfix_soft_bounce(GONE).replace(b"Action: failed", b"Action: delayed")
    assert read_delivery_report(delayed) is None
    reply = b"From: pi@example.net\r\nTo: replies@reply.example.org\r\nSubject: Re\r\n\r\n4\r\n"
    assert read_delivery_report(reply) is None


@pytest.mark.django_db(transaction=True)
def test_a_bounce_at_the_inbound_address_suppresses_the_address_and_the_sweep_skips_it(
    folder_store,
):
    """Gmail's DSN for a PI's dead address: recorded as a hard bounce (not read as a reply),
    the address is suppressed with the report as its source, and the next sweep records the
    PI's new-proposal notice `suppressed` instead of mailing it again."""
    pi = baker.make(get_user_model(), username="gone", email="Gone.PI@example.net")
    earlier = _mailed(pi)
    baker.make(Proposal, pi=pi, title="Soil carbon", status=Proposal.Status.IN_REVIEW)
    folder_store.put("bounce-1", _to_envelope_sender(reports.gmail_hard_bounce(GONE), earlier))

    poll_once()

    mail = InboundEmail.objects.get()
    assert (mail.status, mail.reason) == (InboundEmail.Status.REJECTED, "bounce")
    assert "hard_bounce" in mail.detail and not Reply.objects.exists()
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.reason) == (GONE, "hard_bounce")
    assert "bounce-1" in suppression.source_report and "5.1.1" in suppression.source_report
    assert suppression.expires_at is None

    summary = sweep_new_proposals(now=timezone.now())

    assert (summary.sent, summary.suppressed) == (0, 1)
    row = EmailNotification.objects.get(user=pi, kind="new_proposal")
    assert row.status == EmailNotification.Status.SUPPRESSED and row.sent_at is None
    assert sweep_new_proposals(now=timezone.now()).suppressed == 0  # recorded once


@pytest.mark.django_db(transaction=True)
def test_a_complaint_report_suppresses_the_address(folder_store):
    pi = baker.make(get_user_model(), username="angry", email=GONE)
    folder_store.put("arf-1", _to_envelope_sender(reports.arf_complaint(GONE), _mailed(pi)))
    poll_once()
    assert InboundEmail.objects.get().reason == "bounce"
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.reason) == (GONE, "complaint")
    assert DeliveryFeedback.objects.get().source == "arf"


@pytest.mark.django_db(transaction=True)
def test_a_report_that_quotes_no_token_of_a_mail_to_the_address_suppresses_nothing(
    folder_store,
):
    """Anyone can mail a "bounce" to the inbound address: a report counts only when it was
    sent to the envelope sender of a notification sent to the address it names (issue 28.5:
    quoting that notification's reply token, which every copy of the mail shows, no longer
    does)."""
    pi = baker.make(get_user_model(), username="pi", email=GONE)
    other = baker.make(get_user_model(), username="other", email="other@example.net")
    mailed = _mailed(pi)
    folder_store.put("forged-1", reports.ses_hard_bounce(GONE))  # a token nobody was sent
    folder_store.put("forged-2", _to_envelope_sender(reports.ses_hard_bounce(GONE), _mailed(other)))
    folder_store.put("forged-3", reports.ses_hard_bounce(GONE, mailed.token))  # public token
    folder_store.put("genuine", _to_envelope_sender(reports.ses_hard_bounce(GONE), mailed))
    poll_once()
    rows = {row.store_key: row for row in InboundEmail.objects.all()}
    assert {key: row.reason for key, row in rows.items()} == {
        "forged-1": "bounce",
        "forged-2": "bounce",
        "forged-3": "bounce",
        "genuine": "bounce",
    }
    assert all("not recorded" in rows[f"forged-{n}"].detail for n in (1, 2, 3))
    assert DeliveryFeedback.objects.count() == 1
    assert Suppression.objects.get().source_report.startswith("inbound mail genuine")


def _to_envelope_sender(report: bytes, notification: EmailNotification) -> bytes:
    """The report as the receiving server sends it: to the notification's envelope sender."""
    return reports.addressed_to(report, bounce_address_for(notification.pk))


def _mailed(user) -> EmailNotification:
    """A notification that went to `user` (its token is what a real report quotes)."""
    return baker.make(
        EmailNotification,
        user=user,
        kind="digest",
        to_address=user.email,
        status="sent",
        sent_at=timezone.now(),
        ses_message_id="m-1",
    )
