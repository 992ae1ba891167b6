"""Acceptance: which reply is accepted and which is rejected, with its reason (token, sender,
expiry, digest, rate limit, auto-replies, unsubscribe) (inbound_email/services/acceptance.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.message import EmailMessage

import pytest
from django.utils import timezone

from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import parse_mail
from inbound_email.poller import poll_once
from inbound_email.services.acceptance import (
    Accept,
    NotificationSnapshot,
    Reject,
    decide,
    screen,
)
from jobs import run_pending
from notifications.models import EmailNotification, NotificationPreference
from tests.support.mail import PI_ADDRESS, build_mail
from tests.support.stores import key

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status
Reason = InboundEmail.Reason
NStatus = EmailNotification.Status


@pytest.mark.parametrize("body", ["Please merge the two proposals.", "5"])
def test_reply_to_a_digest_is_rejected_with_no_proposal(folder_store, make_notification, body):
    """R2: a digest has no proposal, so its instructions failed every Slack attempt and landed
    in the inbox under run_id="". A reply to a notification without a proposal is rejected
    with a clear reason; the raw mail is kept (nothing is lost)."""
    digest = make_notification(kind=EmailNotification.Kind.DIGEST, proposal=None)
    EmailNotification.objects.filter(pk=digest.pk).update(proposal=None)
    folder_store.put("d", build_mail(token=digest.token, body=body))

    poll_once()

    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, Reason.NO_PROPOSAL)
    assert row.detail == "instructions must answer a proposal's email"
    assert row.raw is not None
    assert not Reply.objects.exists()
    assert run_pending().claimed == 0


def test_unsubscribe_from_a_digest_still_works(folder_store, make_notification):
    """R2: rejecting instructions to a digest leaves its unsubscribe working."""
    digest = make_notification(kind=EmailNotification.Kind.DIGEST)
    EmailNotification.objects.filter(pk=digest.pk).update(proposal=None)
    folder_store.put("d", build_mail(token=digest.token, subject="unsubscribe", body=""))
    poll_once()
    assert InboundEmail.objects.get().detail == "unsubscribed: notifications paused"
    assert NotificationPreference.objects.get(user=digest.user).rung == "paused"


@pytest.mark.parametrize(
    ("subject", "body"),
    [
        ("unsubscribe", ""),  # expired notification, List-Unsubscribe mailto
        ("Re: unsubscribe", "Please remove me."),
        ("AW: Unsubscribe", ""),
        ("Fwd: UNSUBSCRIBE", ""),
        ("Re: Your proposal", "\n  Unsubscribe  \n"),
    ],
)
def test_unsubscribe_is_honoured_expired_or_with_a_reply_prefix(
    folder_store, make_notification, subject, body
):
    """R4: an unsubscribe to an expired notification was rejected as expired_token, and
    "Re: unsubscribe" or a reply saying just "unsubscribe" was relayed as an instruction."""
    notification = make_notification(
        status=NStatus.EXPIRED, expires_at=timezone.now() - timedelta(days=1)
    )
    folder_store.put("u", build_mail(token=notification.token, subject=subject, body=body))

    poll_once()

    row = InboundEmail.objects.get()
    assert (row.status, row.detail) == (Status.PROCESSED, "unsubscribed: notifications paused")
    assert NotificationPreference.objects.get(user=notification.user).rung == "paused"
    assert not Reply.objects.exists()
    assert run_pending().claimed == 0


def test_unsubscribe_still_needs_the_notified_sender_and_a_known_token(
    folder_store, make_notification
):
    """R4: the relaxed unsubscribe still rejects a spoofed sender and an unknown token."""
    notification = make_notification(
        status=NStatus.EXPIRED, expires_at=timezone.now() - timedelta(days=1)
    )
    folder_store.put(
        "spoof",
        build_mail(token=notification.token, subject="Re: unsubscribe", sender="x@evil.example"),
    )
    folder_store.put("unknown", build_mail(token="ab" * 16, subject="unsubscribe"))
    poll_once()
    reasons = dict(InboundEmail.objects.values_list("store_key", "reason"))
    assert reasons == {"spoof": Reason.SENDER_MISMATCH, "unknown": Reason.UNKNOWN_TOKEN}
    assert not NotificationPreference.objects.filter(rung="paused").exists()


def test_a_sentence_mentioning_unsubscribe_is_an_instruction(folder_store, notification):
    """R4: only a bare "unsubscribe" pauses; a sentence mentioning it is an instruction."""
    body = "Unsubscribe the co-PI from the mailing list, please."
    folder_store.put("i", build_mail(token=notification.token, body=body))
    poll_once()
    assert Reply.objects.get().instruction == body
    assert not NotificationPreference.objects.filter(rung="paused").exists()


def test_in_reply_to_matches_a_full_message_id_from_the_django_sender(
    folder_store, make_notification
):
    """R7: the fallback compared only the part before "@" with ses_message_id, but the Django
    sender stores the full `id@domain`: replies without the token address were unknown."""
    notification = make_notification(ses_message_id="176484.123.456789@Assistant.Example")
    mail = build_mail(
        token=None,
        body="5",
        headers={"In-Reply-To": "<176484.123.456789@Assistant.Example>"},
    )
    folder_store.put("irt", mail)
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.PROCESSED, Reason.NONE)
    assert Reply.objects.get().notification == notification


def test_string_rating_is_coerced(store, notification):
    store.put(
        key(store, "m"), build_mail(token=notification.token, body="Rating: 4/5\nAdd a timeline.")
    )
    poll_once()
    reply = Reply.objects.get()
    assert (reply.rating, reply.instruction) == (4, "Add a timeline.")


def test_rate_limit_is_enforced_from_the_database(folder_store, notification, settings):
    """COR-19: MAX_REPLIES_PER_TOKEN_PER_HOUR was defined and never used."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 2
    for i in range(3):
        folder_store.put(f"r{i}", build_mail(token=notification.token, body=f"{i + 1}"))
    poll_once()
    rows = InboundEmail.objects.order_by("store_key")
    assert [r.status for r in rows] == [Status.PROCESSED, Status.PROCESSED, Status.REJECTED]
    assert rows[2].reason == Reason.RATE_LIMITED
    assert "2 replies in the last hour (limit 2)" in rows[2].detail
    assert Reply.objects.count() == 2


def test_rate_limit_window_is_one_hour(folder_store, notification, settings):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1
    folder_store.put("old", build_mail(token=notification.token, body="1"))
    poll_once()
    Reply.objects.update(created_at=timezone.now() - timedelta(minutes=61))
    folder_store.put("new", build_mail(token=notification.token, body="2"))
    poll_once()
    assert InboundEmail.objects.get(store_key="new").status == Status.PROCESSED


def test_spoofed_sender_is_rejected(folder_store, notification):
    folder_store.put("s", build_mail(token=notification.token, sender="mallory@evil.example"))
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, Reason.SENDER_MISMATCH)
    assert "m***@evil.example" in row.detail and "mallory" not in row.detail
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.SENT
    assert not Reply.objects.exists()


def test_expired_token_is_rejected(folder_store, make_notification):
    expired = make_notification(expires_at=timezone.now() - timedelta(minutes=1))
    folder_store.put("e", build_mail(token=expired.token))
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, Reason.EXPIRED_TOKEN)


def test_unknown_and_missing_token_are_rejected(folder_store):
    folder_store.put("u", build_mail(token="ab" * 32))
    folder_store.put("n", build_mail(token=None))
    poll_once()
    reasons = dict(InboundEmail.objects.values_list("store_key", "reason"))
    assert reasons == {"u": Reason.UNKNOWN_TOKEN, "n": Reason.NO_TOKEN}


def test_token_from_in_reply_to(folder_store, notification):
    mail = build_mail(
        token=None,
        body="5",
        headers={"In-Reply-To": f"<{notification.ses_message_id}@email.amazonses.com>"},
    )
    folder_store.put("irt", mail)
    poll_once()
    assert InboundEmail.objects.get().status == Status.PROCESSED
    assert Reply.objects.get().notification == notification


@pytest.mark.parametrize(
    ("headers", "sender", "reason"),
    [
        ({"Auto-Submitted": "auto-replied"}, PI_ADDRESS, Reason.AUTO_REPLY),
        ({"Precedence": "bulk"}, PI_ADDRESS, Reason.AUTO_REPLY),
        ({"X-Autoreply": "yes"}, PI_ADDRESS, Reason.AUTO_REPLY),
        ({}, "MAILER-DAEMON@university.example", Reason.BOUNCE),
    ],
)
def test_auto_replies_and_bounces_never_count(folder_store, notification, headers, sender, reason):
    folder_store.put("a", build_mail(token=notification.token, sender=sender, headers=headers))
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, reason)
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.SENT


def test_list_unsubscribe_mail_pauses_the_user_and_relays_nothing(folder_store, notification):
    """The List-Unsubscribe mailto our notifications advertise (subject "unsubscribe") pauses
    the user; it is not an instruction for the agent."""
    from notifications.models import NotificationPreference

    folder_store.put("unsub", build_mail(token=notification.token, subject="unsubscribe", body=""))
    folder_store.put(
        "spoofed-unsub",
        build_mail(
            token=notification.token, subject="unsubscribe", body="", sender="x@evil.example"
        ),
    )
    poll_once()
    rows = {row.store_key: row for row in InboundEmail.objects.all()}
    assert rows["unsub"].status == Status.PROCESSED
    assert rows["unsub"].detail == "unsubscribed: notifications paused"
    assert rows["spoofed-unsub"].reason == Reason.SENDER_MISMATCH
    assert NotificationPreference.objects.get(user=notification.user).rung == "paused"
    assert not Reply.objects.exists()
    assert run_pending().claimed == 0


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
