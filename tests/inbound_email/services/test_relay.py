"""The instruction relay (outbox): Slack through a local Slack Web API server, or the database
inbox; the mail is deleted and the notification marked responded only once it is durable."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from model_bakery import baker

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.relay import reply_relay
from jobs import run_pending
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_proposal_reviews
from tests.support.mail import build_mail
from tests.support.slack_server import SlackServer
from tests.support.stores import intake_keys

Status = InboundEmail.Status
NStatus = EmailNotification.Status
INSTRUCTION = "Rating: 3\nPlease shorten the abstract <!channel> and ask <@U123ABC> & co."


def responded(notification: EmailNotification) -> bool:
    notification.refresh_from_db()
    return notification.status == EmailNotification.Status.RESPONDED


def run_when_due(reply: Reply) -> None:
    """Wait for the scheduled retry of `reply`, then drain due jobs."""
    reply.refresh_from_db()
    if reply.relay_next_attempt_at:
        wait = (reply.relay_next_attempt_at - timezone.now()).total_seconds()
        time.sleep(max(0.0, wait) + 0.05)
    run_pending()


def drain_relay_jobs() -> None:
    """Run due jobs, then any retry whose run_after has come (Retry-After is 1 s here)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        run_pending()
        if not Reply.objects.filter(relay_status=Reply.RelayStatus.PENDING).exists():
            return
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_slack_off_instruction_lands_in_the_database_inbox(folder_store, notification):
    folder_store.put("m", build_mail(token=notification.token, body=INSTRUCTION))

    poll_once()
    # Saved durably before anything else: the reply, and the mail still in the intake.
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.PENDING
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY
    assert intake_keys(folder_store) == ["m"]
    assert not responded(notification)

    run_pending()

    reply.refresh_from_db()
    message = Message.objects.get()
    assert reply.relay_status == Reply.RelayStatus.INBOXED
    assert reply.message_ts == message.ts
    assert message.run_id == "run-42" and message.source == "email"
    assert message.text == "Please shorten the abstract <!channel> and ask <@U123ABC> & co."
    seconds, _, micro = message.ts.partition(".")
    assert seconds.isdigit() and len(micro) == 6  # a canonical "seconds.micro" id
    assert not reply.needs_operator
    assert responded(notification)
    assert InboundEmail.objects.get().status == Status.PROCESSED
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_failed_posts_never_mark_responded_or_delete_the_mail(
    s3_store, notification, slack, settings
):
    """COR-32: with Slack on, a failed post returned False yet the caller marked the
    notification responded and deleted the S3 object: the instruction was silently consumed.

    Here the Slack server answers an error, then 429 with Retry-After, then ok: until the ok,
    nothing is marked responded and the object stays; the message is posted exactly once.
    """
    settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 0.3  # one attempt per drain
    slack.script(
        SlackServer.error("internal_error"),
        SlackServer.rate_limited(retry_after=1),
        SlackServer.ok(),
    )
    s3_store.put(s3_store.prefix + "m", build_mail(token=notification.token, body=INSTRUCTION))
    poll_once()

    run_pending()  # attempt 1: error
    reply = Reply.objects.get()
    assert (reply.relay_status, reply.relay_attempts) == (Reply.RelayStatus.PENDING, 1)
    assert "internal_error" in reply.relay_last_error
    assert not responded(notification)
    assert intake_keys(s3_store) == [s3_store.prefix + "m"]

    before = timezone.now()
    run_when_due(reply)  # attempt 2: 429 with Retry-After: 1
    reply.refresh_from_db()
    assert reply.relay_attempts == 2
    retry_at = reply.relay_next_attempt_at
    assert retry_at >= before + timezone.timedelta(seconds=1)  # Retry-After honoured
    assert Job.objects.filter(kind="inbound_email.relay_reply", run_after=retry_at).exists()
    assert not responded(notification)
    assert intake_keys(s3_store) == [s3_store.prefix + "m"]
    poll_once()  # a poll meanwhile neither re-handles nor deletes the awaiting mail
    assert intake_keys(s3_store) == [s3_store.prefix + "m"]

    drain_relay_jobs()  # attempt 3, after Retry-After: ok

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert reply.slack_ts
    assert len(slack.attempts()) == 3
    assert len(slack.posts) == 1  # posted exactly once
    post = slack.posts[0]
    assert post["channel"] == "C0PROPOSAL"
    assert slack.attempts()[0].authorization == "Bearer xoxb-test-token"
    assert responded(notification)
    assert InboundEmail.objects.get().status == Status.PROCESSED
    assert intake_keys(s3_store) == []
    assert not Message.objects.exists()
    run_pending()
    assert len(slack.attempts()) == 3  # no duplicate wake-up posts again


@pytest.mark.django_db(transaction=True)
def test_mail_text_cannot_ping_anyone_in_slack(folder_store, notification, slack):
    folder_store.put("m", build_mail(token=notification.token, body=INSTRUCTION))
    poll_once()
    run_pending()
    text = slack.posts[0]["text"]
    assert "<!channel>" not in text and "<@U123ABC>" not in text
    assert "&lt;!channel&gt;" in text and "&lt;@U123ABC&gt;" in text and "&amp; co." in text
    assert slack.posts[0]["parse"] == "none"


@pytest.mark.django_db(transaction=True)
def test_retry_budget_spent_falls_back_to_the_inbox_for_an_operator(
    folder_store, make_notification, slack, settings
):
    settings.INBOUND_RELAY_MAX_ATTEMPTS = 3
    slack.default = SlackServer.error("channel_not_found")
    notification = make_notification()
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim as co-PI."))
    poll_once()

    for _ in range(3):
        run_pending()

    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.INBOXED and reply.needs_operator
    assert "channel_not_found" in reply.relay_last_error
    assert Message.objects.get().text == "Please add Kim as co-PI."
    assert Message.objects.get().metadata["slack_failed"] is True
    assert len(slack.attempts()) == 3  # the budget: three posts, then the inbox
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_missing_channel_is_retried_not_consumed(folder_store, make_notification, slack, settings):
    """COR-32: no channel used to return False and the mail was consumed anyway."""
    settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 60
    notification = make_notification()
    notification.proposal.slack_channel = ""
    notification.proposal.save()
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim as co-PI."))
    poll_once()
    run_pending()
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.PENDING
    assert "no Slack channel" in reply.relay_last_error
    assert not responded(notification)
    assert intake_keys(folder_store) == ["m"]
    assert slack.calls == []

    # An operator sets the channel; the next attempt uses it.
    notification.proposal.slack_channel = "C0LATER"
    notification.proposal.save()
    Reply.objects.update(relay_next_attempt_at=None)
    reply_relay(reply_id=reply.pk)
    assert slack.posts[0]["channel"] == "C0LATER"
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db
def test_relay_of_a_finished_reply_is_a_no_op(folder_store, notification):
    folder_store.put("m", build_mail(token=notification.token, body="5"))
    poll_once()
    assert reply_relay(reply_id=Reply.objects.get().pk) == "skipped"


@pytest.mark.django_db
def test_lost_relay_wake_up_is_re_enqueued_by_the_poller(folder_store, notification):
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim."))
    poll_once()
    Job.objects.all().delete()  # the wake-up was lost (a job that failed for good)
    Reply.objects.update(relay_next_attempt_at=timezone.now() - timezone.timedelta(hours=1))

    summary = poll_once()

    assert summary.outcomes["relay_requeued"] == 1
    assert Job.objects.filter(kind="inbound_email.relay_reply").count() == 1
    run_pending()
    assert Reply.objects.get().relay_status == Reply.RelayStatus.INBOXED


@pytest.mark.django_db
def test_long_instruction_is_truncated_in_slack_only(folder_store, notification, slack):
    folder_store.put("m", build_mail(token=notification.token, body="x" * 5000))
    poll_once()
    run_pending()
    assert len(slack.posts[0]["text"]) < 3300 and "truncated" in slack.posts[0]["text"]
    assert len(Reply.objects.get().instruction) == 5000


@pytest.mark.django_db
def test_on_time_instruction_counts_even_when_the_sweep_runs_before_the_relay(
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


@pytest.mark.django_db
def test_expiry_skips_a_notification_whose_reply_was_accepted(
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


class CommitFailed(Exception):
    """Stands for whatever makes the caller's transaction roll back after the relay."""


@pytest.mark.django_db(transaction=True)
def test_a_relay_whose_transaction_rolls_back_keeps_the_mail_in_the_intake(
    folder_store, notification
):
    """Mutant: calling inbound_email_finalize inside the transaction instead of on_commit."""
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))
    poll_once()
    reply = Reply.objects.get()
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY

    with pytest.raises(CommitFailed), transaction.atomic():
        assert reply_relay(reply_id=reply.pk) == "inboxed"
        raise CommitFailed

    row = InboundEmail.objects.get()
    assert (row.status, row.intake_deleted) == (Status.AWAITING_RELAY, False)
    assert intake_keys(folder_store) == ["m"]
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.PENDING
    assert not Message.objects.exists()  # the inbox insert was rolled back with it

    run_pending()  # the relay job queued at accept time: this attempt commits

    row.refresh_from_db()
    assert (row.status, row.intake_deleted) == (Status.PROCESSED, True)
    assert intake_keys(folder_store) == []
    assert Message.objects.get().text == "Please cut section 3."
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.RESPONDED
