"""The mail itself: templates (text + HTML), Reply-To token, List-Unsubscribe, message ids."""

from __future__ import annotations

import email
from datetime import UTC, datetime
from email import policy

import pytest
from django.core import mail
from django.utils import timezone

from notifications.models import EmailNotification
from notifications.reply_address import reply_address_for, token_from_address
from notifications.senders.base import OutgoingEmail
from notifications.senders.django import DjangoEmailSender
from notifications.sweeps import sweep_digests, sweep_new_proposals, sweep_proposal_reviews

pytestmark = pytest.mark.django_db


def test_review_request_mail_carries_token_reply_to_and_unsubscribe(make_pi):
    pi = make_pi(first_name="Ada", last_name="Lovelace")
    proposal = pi.proposals.get()
    sweep_proposal_reviews()

    row = EmailNotification.objects.get(user=pi)
    [message] = mail.outbox
    assert message.to == [pi.email] and row.to_address == pi.email
    assert message.reply_to == [reply_address_for(row.token)]
    assert token_from_address(message.reply_to[0]) == row.token
    assert len(message.reply_to[0].partition("@")[0]) <= 64  # RFC 5321 local-part limit
    assert message.extra_headers["List-Unsubscribe"] == (
        f"<mailto:{reply_address_for(row.token)}?subject=unsubscribe>"
    )
    assert message.subject == f"Please rate: {proposal.title}"
    assert "Hello Ada Lovelace" in message.body and "rating from 1 to 5" in message.body
    [(html, mimetype)] = message.alternatives
    assert mimetype == "text/html" and f"<strong>{proposal.title}</strong>" in html
    assert row.expires_at.strftime("%Y-%m-%d %H:%M") in message.body
    # The Django adapter's message id is the Message-ID header: `sent` always has one.
    assert message.extra_headers["Message-ID"] == f"<{row.ses_message_id}>"


def test_html_part_escapes_the_title(make_pi):
    pi = make_pi()
    pi.proposals.update(title="<script>x</script> & co")
    sweep_new_proposals()
    [message] = mail.outbox
    html = message.alternatives[0][0]
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<script>x</script> & co" in message.body  # the text part is not HTML-escaped


def test_ses_raw_mail_has_both_parts_and_headers(make_pi, ses):
    pi = make_pi()
    sweep_new_proposals()
    row = EmailNotification.objects.get(user=pi)
    [sent] = ses.messages
    parsed = email.message_from_string(sent.raw_data, policy=policy.default)
    assert parsed["Reply-To"] == reply_address_for(row.token)
    assert (
        parsed["List-Unsubscribe"].strip() == f"<mailto:{parsed['Reply-To']}?subject=unsubscribe>"
    )
    assert [part.get_content_type() for part in parsed.walk()][1:] == ["text/plain", "text/html"]
    assert row.ses_message_id == sent.id


def test_django_sender_returns_the_message_id_it_set():
    outgoing = OutgoingEmail(
        to="pi@example.org",
        subject="s",
        text="t",
        html="<p>t</p>",
        reply_to=reply_address_for("ab" * 32),
        from_email="Assistant <assistant@example.org>",
    )
    message_id = DjangoEmailSender().send(outgoing)
    assert message_id.endswith("@example.org")
    assert mail.outbox[0].extra_headers["Message-ID"] == f"<{message_id}>"


def test_new_proposal_notice_goes_once_and_only_to_immediate_pis(make_pi):
    immediate = make_pi(proposals=2)
    make_pi(rung="daily")
    make_pi(rung="paused")
    assert sweep_new_proposals().sent == 2
    assert sweep_new_proposals().sent == 0
    assert {m.to[0] for m in mail.outbox} == {immediate.email}


def test_users_without_address_or_inactive_are_skipped(make_pi):
    make_pi(email="")
    make_pi(is_active=False)
    summary = sweep_proposal_reviews(now=timezone.now())
    assert (summary.users, summary.skipped, summary.sent) == (2, 2, 0)
    assert not EmailNotification.objects.exists()


MONDAY_9 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def test_digest_does_not_invite_instructions(make_pi):
    """R2: the digest said "Reply to this email to give the agent instructions", but a digest
    has no proposal, so such an instruction could not be routed to any conversation."""
    make_pi(proposals=2, rung="daily")
    assert sweep_digests(now=MONDAY_9).sent == 1
    [message] = mail.outbox
    html = message.alternatives[0][0]
    for text in (message.body, html):
        assert "instruction" not in text.lower()
        assert "reply to this email" not in text.lower()
        assert "unsubscribe" in text  # the way out is still offered


@pytest.mark.parametrize("sender", ["django", "ses"])
def test_subject_is_not_html_escaped(make_pi, sender, request):
    """Users saw "Please rate: Tom &amp; Jerry": the subject template was autoescaped. The
    header as it leaves the sender (locmem backend, or the raw mail SES got) decodes to the
    title as written."""
    if sender == "ses":
        ses = request.getfixturevalue("ses")
    pi = make_pi()
    pi.proposals.update(title='Tom & Jerry <"quoted"> it\'s')
    sweep_proposal_reviews()

    if sender == "ses":
        [sent] = ses.messages
        raw = sent.raw_data.encode()
    else:
        [message] = mail.outbox
        raw = message.message().as_bytes()
    parsed = email.message_from_bytes(raw, policy=policy.default)
    assert str(parsed["Subject"]) == 'Please rate: Tom & Jerry <"quoted"> it\'s'
