"""Defects found in review (R1-R7): each test fails if its fix is removed."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db.models import ProtectedError
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services import reply_relay
from jobs import run_pending
from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_proposal_reviews
from tests.support.mail import build_mail
from tests.support.slack_server import SlackServer
from tests.support.stores import intake_keys

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status
Reason = InboundEmail.Reason
NStatus = EmailNotification.Status


# --- R1: an on-time answer is never counted as missed ---------------------------------------


def test_r1_on_time_instruction_counts_even_when_the_sweep_runs_before_the_relay(
    folder_store, make_notification, slack, settings
):
    """R1: the reply was saved on time but the relay (Slack backoff) had not finished when the
    review sweep ran: the sweep wrote `expired` and counted a miss (stepping the PI down), and
    the relay later skipped marking it responded. An accepted reply is never expired; the
    notification is marked responded (count reset) once the instruction is posted, and the
    mail stays in the intake until then (I8)."""
    settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 3600  # the retry is an hour away
    slack.default = SlackServer.error("internal_error")
    notification = make_notification(expires_at=timezone.now() + timedelta(minutes=30))
    baker.make(NotificationPreference, user=notification.user, consecutive_missed=2)
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))

    poll_once()
    run_pending()  # the first Slack post fails; the next attempt is an hour away
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.PENDING

    summary = sweep_proposal_reviews(now=timezone.now() + timedelta(hours=2))

    assert summary.expired == 0
    notification.refresh_from_db()
    assert notification.status == NStatus.SENT  # not expired; responded only once relayed
    preference = NotificationPreference.objects.get(user=notification.user)
    assert (preference.consecutive_missed, preference.rung) == (2, "immediate")
    # I8: the instruction is still pending and its mail still in the intake.
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY
    assert intake_keys(folder_store) == ["m"]

    slack.default = SlackServer.ok()
    Reply.objects.update(relay_next_attempt_at=None)
    assert reply_relay(reply_id=reply.pk) == "posted"
    assert InboundEmail.objects.get().status == Status.PROCESSED
    notification.refresh_from_db()
    assert notification.status == NStatus.RESPONDED
    preference.refresh_from_db()
    assert (preference.consecutive_missed, preference.rung) == (0, "immediate")


def test_r1_expiry_skips_a_notification_whose_reply_was_accepted(
    folder_store, make_notification, caplog
):
    """R1: a notification with an accepted reply whose relay is pending is still `sent`; the
    sweep must not expire it. A relay that finds its notification no longer open logs it
    (never a silent skip)."""
    notification = make_notification(expires_at=timezone.now() + timedelta(minutes=30))
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))
    poll_once()
    reply = Reply.objects.get()
    notification.refresh_from_db()
    assert notification.status == NStatus.SENT  # the relay has not run yet

    summary = sweep_proposal_reviews(now=timezone.now() + timedelta(hours=2))
    assert summary.expired == 0
    notification.refresh_from_db()
    assert notification.status == NStatus.SENT

    # And if it was expired meanwhile, the relay says so instead of skipping silently.
    EmailNotification.objects.filter(pk=notification.pk).update(status=NStatus.EXPIRED)
    with caplog.at_level(logging.INFO, logger="inbound_email.services"):
        assert reply_relay(reply_id=reply.pk) == "inboxed"
    late = [r for r in caplog.records if getattr(r, "action", "") == "reply_late"]
    assert len(late) == 1 and "expired" in late[0].getMessage()
    assert InboundEmail.objects.get().status == Status.PROCESSED


# --- R2: instructions to a digest cannot be routed --------------------------------------------


@pytest.mark.parametrize("body", ["Please merge the two proposals.", "5"])
def test_r2_reply_to_a_digest_is_rejected_with_no_proposal(folder_store, make_notification, body):
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


def test_r2_unsubscribe_from_a_digest_still_works(folder_store, make_notification):
    digest = make_notification(kind=EmailNotification.Kind.DIGEST)
    EmailNotification.objects.filter(pk=digest.pk).update(proposal=None)
    folder_store.put("d", build_mail(token=digest.token, subject="unsubscribe", body=""))
    poll_once()
    assert InboundEmail.objects.get().detail == "unsubscribed: notifications paused"
    assert NotificationPreference.objects.get(user=digest.user).rung == "paused"


# --- R3: deleting a proposal strands the mail -----------------------------------------------


def test_r3_a_proposal_with_replies_cannot_be_deleted(folder_store, notification, admin_client):
    """R3: deleting a proposal cascaded through its notifications to the Reply and left the
    mail `awaiting_relay` forever. The Reply protects its notification, and the admin offers
    no delete for proposals or preferences (deleting a preference un-pauses a user)."""
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))
    poll_once()
    assert Reply.objects.count() == 1

    with pytest.raises(ProtectedError):
        notification.proposal.delete()
    assert Reply.objects.count() == 1
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY

    proposal_delete = reverse(
        "admin:notifications_proposal_delete", args=[notification.proposal.pk]
    )
    assert admin_client.get(proposal_delete).status_code == 403
    preference, _ = NotificationPreference.objects.update_or_create(
        user=notification.user, defaults={"rung": "paused"}
    )
    preference_delete = reverse(
        "admin:notifications_notificationpreference_delete", args=[preference.pk]
    )
    assert admin_client.post(preference_delete, {"post": "yes"}).status_code == 403
    assert NotificationPreference.objects.get(pk=preference.pk).rung == "paused"


# --- R4: unsubscribe is reliable ------------------------------------------------------------


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
def test_r4_unsubscribe_is_honoured_expired_or_with_a_reply_prefix(
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


def test_r4_unsubscribe_still_needs_the_notified_sender_and_a_known_token(
    folder_store, make_notification
):
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


def test_r4_a_sentence_mentioning_unsubscribe_is_an_instruction(folder_store, notification):
    body = "Unsubscribe the co-PI from the mailing list, please."
    folder_store.put("i", build_mail(token=notification.token, body=body))
    poll_once()
    assert Reply.objects.get().instruction == body
    assert not NotificationPreference.objects.filter(rung="paused").exists()


# --- R6: operator alarms can be acknowledged --------------------------------------------------


def _operator_reply(folder_store, notification) -> Reply:
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim."))
    poll_once()
    Reply.objects.update(needs_operator=True, relay_last_error="channel_not_found")
    return Reply.objects.get()


def test_r6_operator_acknowledges_a_needs_operator_reply_in_the_admin(
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


def test_r6_acknowledge_needs_the_change_permission(folder_store, notification, client):
    from django.contrib.auth.models import Permission

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


def test_r6_acknowledge_service_only_takes_replies_that_need_an_operator(
    folder_store, notification
):
    from inbound_email.services import reply_acknowledge

    folder_store.put("m", build_mail(token=notification.token, body="5"))
    poll_once()
    reply = Reply.objects.get()
    assert reply_acknowledge(reply_ids=[reply.pk]) == 0
    reply.refresh_from_db()
    assert reply.operator_acknowledged_at is None


# --- R7: In-Reply-To with the full Message-ID ---------------------------------------------------


def test_r7_in_reply_to_matches_a_full_message_id_from_the_django_sender(
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
