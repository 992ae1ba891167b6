"""The acceptance policy on its own: parsed mail plus a notification snapshot, no database.

Each branch of `decide` in the order an operator reads the rejection reasons; the end-to-end
paths through the poller are in test_poller.py and test_review_defects.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.message import EmailMessage

import pytest

from inbound_email.models import InboundEmail
from inbound_email.parsing import parse_mail
from inbound_email.services.acceptance import (
    Accept,
    NotificationSnapshot,
    Reject,
    decide,
    screen,
)
from notifications.models import EmailNotification

Reason = InboundEmail.Reason
NStatus = EmailNotification.Status
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
PI = "pi@university.example"


def mail(body: str = "4\nPlease tighten the budget.", *, sender: str = PI, **headers: str):
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "replies+tok@reply.localhost"
    msg["Subject"] = headers.pop("subject", "Re: Your proposal")
    for name, value in headers.items():
        msg[name.replace("_", "-")] = value
    msg.set_content(body)
    return parse_mail(msg.as_bytes())


def snapshot(**overrides) -> NotificationSnapshot:
    fields = {
        "to_address": PI,
        "status": NStatus.SENT,
        "expires_at": NOW + timedelta(days=1),
        "has_proposal": True,
        "replies_last_hour": 0,
    }
    fields.update(overrides)
    return NotificationSnapshot(**fields)


def run(parsed, *, token: str = "tok", notification=None, limit: int = 5):
    return decide(
        mail=parsed,
        token=token,
        notification=snapshot() if notification is None else notification,
        now=NOW,
        max_replies_per_hour=limit,
    )


def test_an_on_time_reply_from_the_notified_address_is_accepted_with_its_content():
    decision = run(mail())
    assert isinstance(decision, Accept) and not decision.unsubscribe
    assert decision.content.rating == 4
    assert decision.content.instruction == "Please tighten the budget."


@pytest.mark.parametrize(
    ("parsed", "kwargs", "reason"),
    [
        (mail(Auto_Submitted="auto-replied"), {}, Reason.AUTO_REPLY),
        (mail(), {"token": ""}, Reason.NO_TOKEN),
        (mail(sender="someone@else.example"), {}, Reason.SENDER_MISMATCH),
        (mail(), {"notification": snapshot(expires_at=NOW)}, Reason.EXPIRED_TOKEN),
        (mail(), {"notification": snapshot(status=NStatus.EXPIRED)}, Reason.EXPIRED_TOKEN),
        (mail(), {"notification": snapshot(status=NStatus.PENDING)}, Reason.TOKEN_NOT_OPEN),
        (mail(), {"notification": snapshot(has_proposal=False)}, Reason.NO_PROPOSAL),
        (mail(), {"notification": snapshot(replies_last_hour=5)}, Reason.RATE_LIMITED),
        (mail("Rating: great"), {}, Reason.INVALID_RATING),
        (mail("\n"), {}, Reason.EMPTY_REPLY),
    ],
)
def test_each_rejection_names_its_reason(parsed, kwargs, reason):
    decision = run(parsed, **kwargs)
    assert isinstance(decision, Reject)
    assert decision.reason == reason
    assert decision.detail


def test_an_unknown_token_is_rejected():
    decision = decide(mail=mail(), token="tok", notification=None, now=NOW, max_replies_per_hour=5)
    assert decision == Reject(Reason.UNKNOWN_TOKEN, "the token matches no notification")


def test_sender_mismatch_detail_redacts_both_addresses():
    decision = run(mail(sender="intruder@evil.example"))
    assert isinstance(decision, Reject)
    assert "intruder@evil.example" not in decision.detail and PI not in decision.detail


def test_an_answered_notification_still_takes_replies_below_the_rate_limit():
    notification = snapshot(status=NStatus.RESPONDED, replies_last_hour=4)
    assert isinstance(run(mail(), notification=notification), Accept)


def test_unsubscribe_is_honoured_after_expiry_but_needs_the_notified_sender():
    expired = snapshot(status=NStatus.EXPIRED, expires_at=NOW - timedelta(days=3))
    assert run(mail(subject="Re: unsubscribe"), notification=expired) == Accept(unsubscribe=True)
    spoofed = run(mail(subject="unsubscribe", sender="x@evil.example"), notification=expired)
    assert isinstance(spoofed, Reject) and spoofed.reason == Reason.SENDER_MISMATCH


def test_screen_decides_auto_replies_from_the_mail_alone():
    assert screen(mail()) is None
    bounced = screen(mail(sender="MAILER-DAEMON@mx.example"))
    assert isinstance(bounced, Reject) and bounced.reason == Reason.BOUNCE
