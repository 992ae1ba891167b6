"""The instruction relay (outbox): Slack through a local Slack Web API server, or the database
inbox; the mail is deleted and the notification marked responded only once it is durable."""

from __future__ import annotations

import logging
import signal
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from model_bakery import baker

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.relay import (
    RelayResult,
    relay_metadata,
    reply_relay,
    reply_relay_claim,
    reply_relay_enqueue,
    reply_relay_record,
)
from inbound_email.services.relay_slack import reply_relay_slack
from inbound_email.slack import post_message
from jobs import run_pending
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference
from notifications.sweeps import sweep_proposal_reviews
from tests.support.mail import build_mail
from tests.support.processes import spawn_manage_py
from tests.support.slack_server import SlackServer
from tests.support.stores import intake_keys
from tests.support.threads import Background

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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wait", ["backoff", "retry_after"])
def test_a_second_wake_up_before_the_scheduled_retry_posts_nothing(
    folder_store, notification, slack, settings, wait
):
    """A refused post schedules the next attempt a minute ahead: by the relay's own backoff,
    or by Slack's Retry-After (the backoff base is 0 here). A second wake-up before then (a
    duplicate job, the stale-relay sweep) finds the relay not due: Slack hears nothing more
    and the attempt budget is untouched."""
    if wait == "backoff":
        settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 60
        slack.script(SlackServer.error("internal_error"))
    else:
        slack.script(SlackServer.rate_limited(retry_after=60))
    folder_store.put("m", build_mail(token=notification.token, body="Please add Kim as co-PI."))
    poll_once()
    run_pending()  # attempt 1: refused, the retry scheduled
    reply = Reply.objects.get()
    assert (reply.relay_status, reply.relay_attempts) == (Reply.RelayStatus.PENDING, 1)
    assert reply.relay_next_attempt_at > timezone.now() + timedelta(seconds=50)
    assert len(slack.attempts()) == 1

    reply_relay_enqueue(reply_id=reply.pk)  # a second wake-up, due at once
    run_pending()

    assert len(slack.attempts()) == 1  # nothing posted before the scheduled retry
    reply.refresh_from_db()
    assert (reply.relay_status, reply.relay_attempts) == (Reply.RelayStatus.PENDING, 1)
    assert not responded(notification)
    assert intake_keys(folder_store) == ["m"]


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


# --- one Slack post per instruction (issue 10, point 3) -----------------------------------

CHANNEL = "C0PROPOSAL"


def accepted_instruction(store, notification, body: str = "Please add Kim as co-PI.") -> Reply:
    store.put("m", build_mail(token=notification.token, body=body))
    poll_once()
    return Reply.objects.get()


def relay_until_settled(max_rounds: int = 10, max_wait: float = 5.0) -> None:
    """Run due relay jobs until no relay is pending or posting; a retry scheduled within
    `max_wait` seconds (a relay waiting for a post that may still show up) is waited for."""
    for _ in range(max_rounds):
        run_pending()
        if not Reply.objects.filter(relay_status__in=["pending", "posting"]).exists():
            return
        next_job = (
            Job.objects.filter(kind="inbound_email.relay_reply", status="queued")
            .order_by("run_after")
            .values_list("run_after", flat=True)
            .first()
        )
        wait = (next_job - timezone.now()).total_seconds() if next_job else 0.0
        time.sleep(min(max(wait, 0.0), max_wait) + 0.05)


@contextmanager
def database_error_when_recording_a_post():
    """A real PostgreSQL error on the UPDATE that records a reply as posted (a trigger)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_fail_posted() RETURNS trigger AS $$ BEGIN "
            "IF NEW.relay_status = 'posted' THEN RAISE EXCEPTION 'connection lost "
            "after the post'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        cursor.execute(
            "CREATE TRIGGER test_fail_posted BEFORE UPDATE ON inbound_email_reply "
            "FOR EACH ROW EXECUTE FUNCTION test_fail_posted()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_fail_posted ON inbound_email_reply")
            cursor.execute("DROP FUNCTION test_fail_posted()")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(SlackServer.slow(2.5), id="answer-after-the-client-timeout"),
        pytest.param(SlackServer.error_after_post(500), id="500-after-posting"),
        pytest.param(SlackServer.reset_after_post(), id="connection-reset-after-posting"),
        pytest.param(SlackServer.truncated_after_post(), id="answer-cut-short-after-posting"),
    ],
)
def test_failure_after_the_post_still_gives_the_channel_the_instruction_exactly_once(
    folder_store, notification, slack, settings, failure
):
    """Issue 10.3: the post ran inside the job's transaction with a 1 s timeout; a slow answer
    was retried as if nothing had arrived: 6 posts of one instruction, then the inbox on top.
    Now an answer that may hide a post is looked up (metadata in conversations.history)."""
    settings.SLACK_TIMEOUT = 1
    # An unsure post is looked up once it had two claim timeouts to show up (issue 21.7).
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.5
    slack.script(failure, method="chat.postMessage")
    reply = accepted_instruction(folder_store, notification)

    relay_until_settled()

    channel = slack.channel_messages(CHANNEL)
    assert len(channel) == 1  # exactly once
    assert "Please add Kim as co-PI." in channel[0]["text"]
    assert channel[0]["metadata"] == {
        "event_type": "pi_instruction",
        "event_payload": {"reply_id": reply.pk},
    }
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert reply.slack_ts == channel[0]["ts"]
    assert len(slack.attempts("chat.postMessage")) == 1
    lookup = slack.attempts("conversations.history")[0].args
    assert lookup["channel"] == CHANNEL and lookup["include_all_metadata"] in ("1", "true")
    assert not Message.objects.exists()  # no inbox copy on top
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_database_error_after_a_successful_post_does_not_post_again(
    folder_store, notification, slack, settings
):
    """Issue 10.3: a database error after Slack accepted the post rolled the attempt back,
    and the retry posted again. The claim is committed before the post, so the attempt is
    found `posting`; once its claim expires it is looked up and recorded, not reposted."""
    reply = accepted_instruction(folder_store, notification)

    with database_error_when_recording_a_post():
        summary = run_pending()

    assert summary.retried == 1  # the job saw the database error
    assert len(slack.channel_messages(CHANNEL)) == 1
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTING  # the committed claim survived
    assert reply.relay_attempts == 1
    assert not responded(notification)
    assert intake_keys(folder_store) == ["m"]  # I8: the mail is kept meanwhile

    run_pending()  # a wake-up while the claim is live: not posted again
    assert len(slack.attempts("chat.postMessage")) == 1

    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.5
    time.sleep(0.6)
    assert poll_once().outcomes["relay_requeued"] == 1  # the expired claim is picked up
    relay_until_settled()

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert reply.slack_ts == slack.channel_messages(CHANNEL)[0]["ts"]
    assert len(slack.channel_messages(CHANNEL)) == 1
    assert len(slack.attempts("chat.postMessage")) == 1
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_worker_killed_between_the_post_and_its_record_is_resolved_without_a_second_post(
    folder_store, notification, slack, settings, subprocess_env
):
    """A crash between the post and its record: `run_jobs --burst` in a real process claims
    the relay and posts (Slack keeps the message but has not answered yet) and is SIGKILLed.
    The relay is left `posting`; after its claim expires it is looked up: no second post."""
    reply = accepted_instruction(folder_store, notification)
    slack.script(SlackServer.slow(60), method="chat.postMessage")
    env = {
        **subprocess_env,
        "SLACK_BOT_TOKEN": "xoxb-test-token",
        "SLACK_API_URL": slack.base_url,
        "SLACK_TIMEOUT": "30",
        "INBOUND_EMAIL_STORE": settings.INBOUND_EMAIL_STORE,
    }
    worker = spawn_manage_py("run_jobs", "--burst", env=env)
    try:
        deadline = time.monotonic() + 60
        while not slack.channel_messages(CHANNEL) and time.monotonic() < deadline:
            assert worker.poll() is None, worker.communicate()
            time.sleep(0.05)
        assert len(slack.channel_messages(CHANNEL)) == 1
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=30)

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTING and reply.relay_attempts == 1

    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.5
    time.sleep(0.6)
    poll_once()  # the expired claim is re-enqueued
    relay_until_settled()

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert reply.slack_ts == slack.channel_messages(CHANNEL)[0]["ts"]
    assert reply.relay_attempts == 2
    assert len(slack.channel_messages(CHANNEL)) == 1
    assert len(slack.attempts("chat.postMessage")) == 1
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_claim_left_posting_by_the_real_claim_is_found_by_the_lookup(
    folder_store, notification, slack, settings
):
    """The same crash made with the real claim function: claim, post as the relay would,
    then no record. The next attempt finds the post and records its ts."""
    reply = accepted_instruction(folder_store, notification)
    claim = reply_relay_claim(reply_id=reply.pk, now=timezone.now())
    assert claim is not None
    ts = post_message(channel=claim.channel, text=claim.text, metadata=relay_metadata(reply.pk))

    assert reply_relay(reply_id=reply.pk) == "skipped"  # the claim is still live
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.5
    time.sleep(0.6)
    assert reply_relay(reply_id=reply.pk) == "posted"

    reply.refresh_from_db()
    assert (reply.relay_status, reply.slack_ts) == (Reply.RelayStatus.POSTED, ts)
    assert len(slack.channel_messages(CHANNEL)) == 1
    # A record arriving from the crashed attempt afterwards changes nothing.
    assert reply_relay_record(claim=claim, result=RelayResult("posted", ts=ts)) == "skipped"


@pytest.mark.django_db(transaction=True)
def test_failing_lookup_keeps_the_relay_retrying_past_the_budget_and_never_drops_it(
    folder_store, notification, slack, settings
):
    """After a post whose outcome is unknown, a history lookup that fails must neither post
    again (it may be there) nor fall back to the inbox (it may be there): it retries."""
    settings.INBOUND_RELAY_MAX_ATTEMPTS = 2
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.3  # looked up 0.6 s after the post
    slack.script(SlackServer.error_after_post(500), method="chat.postMessage")
    slack.defaults["conversations.history"] = SlackServer.error("internal_error")
    reply = accepted_instruction(folder_store, notification)

    for _ in range(4):  # attempt 1 posts (500); 2, 3, 4 fail to look it up
        reply.refresh_from_db()
        if reply.relay_next_attempt_at:  # the look-up after the unsure post waits for it
            time.sleep(max(0.0, (reply.relay_next_attempt_at - timezone.now()).total_seconds()))
        run_pending(limit=1)  # one attempt each (the later retries are due at once here)

    reply.refresh_from_db()
    assert (reply.relay_status, reply.relay_attempts) == (Reply.RelayStatus.PENDING, 4)
    assert "unsure whether an earlier post arrived" in reply.relay_last_error
    assert Job.objects.filter(kind="inbound_email.relay_reply", status="queued").exists()
    assert len(slack.attempts("conversations.history")) == 3
    assert len(slack.attempts("chat.postMessage")) == 1
    assert not Message.objects.exists() and not reply.needs_operator
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY
    assert intake_keys(folder_store) == ["m"]

    del slack.defaults["conversations.history"]  # Slack's history answers again
    relay_until_settled()

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert reply.slack_ts == slack.channel_messages(CHANNEL)[0]["ts"]
    assert len(slack.channel_messages(CHANNEL)) == 1
    assert not Message.objects.exists()
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("last_post_arrived", [False, True], ids=["not-in-slack", "in-slack"])
def test_spent_budget_after_unknown_outcomes_looks_up_before_the_inbox_fallback(
    folder_store, notification, slack, settings, last_post_arrived
):
    """The budget still ends in the inbox with needs_operator, but never on top of a post
    Slack accepted: after unknown outcomes the channel is searched first."""
    settings.INBOUND_RELAY_MAX_ATTEMPTS = 2
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.3  # each unsure post waited for 0.6 s
    slack.script(
        SlackServer.error("internal_error", status=502),  # not kept, outcome unknown
        SlackServer.error_after_post(500) if last_post_arrived else SlackServer.error(status=503),
        method="chat.postMessage",
    )
    reply = accepted_instruction(folder_store, notification)

    relay_until_settled()

    reply.refresh_from_db()
    assert len(slack.attempts("chat.postMessage")) == 2  # the budget: two posts
    assert reply.relay_attempts == 3  # and a last attempt that only looked
    if last_post_arrived:
        assert reply.relay_status == Reply.RelayStatus.POSTED
        assert reply.slack_ts == slack.channel_messages(CHANNEL)[0]["ts"]
        assert not Message.objects.exists() and not reply.needs_operator
    else:
        assert slack.channel_messages(CHANNEL) == []
        assert reply.relay_status == Reply.RelayStatus.INBOXED and reply.needs_operator
        assert "503" in reply.relay_last_error or "internal_error" in reply.relay_last_error
        assert Message.objects.get().text == "Please add Kim as co-PI."
    assert len(slack.attempts("conversations.history")) == 2
    assert responded(notification)
    assert intake_keys(folder_store) == []


# --- a Slack answer after the claim timeout (issue 21, point 7) ----------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "late",
    [
        pytest.param(SlackServer.late(1.6), id="answer-and-message-after-the-claim-timeout"),
        pytest.param(
            SlackServer.late(1.6, trickle=True), id="answer-trickling-past-the-claim-timeout"
        ),
    ],
)
def test_a_slack_answer_after_the_claim_timeout_never_leads_to_a_second_post(
    folder_store, notification, slack, settings, late
):
    """Issue 21.7: worker A posts; Slack takes longer than the claim timeout to handle it
    (the message shows up in the channel only with the answer). Worker B, coming after the
    timeout, found nothing in the history and posted again; A's late answer was then
    dropped as a lost claim: two messages. With the trickle, every read of A gets a byte in
    time, so A's per-read timeout never fires and B takes the claim over meanwhile."""
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 1
    slack.script(late, method="chat.postMessage")
    reply = accepted_instruction(folder_store, notification)

    worker_a = Background(lambda: reply_relay(reply_id=reply.pk))
    deadline = time.monotonic() + 5
    while not slack.attempts("chat.postMessage") and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.1)  # past A's claim; Slack has not shown the message yet
    assert slack.channel_messages(CHANNEL) == []

    worker_b = reply_relay(reply_id=reply.pk)  # another worker, after the claim timeout
    assert worker_b in ("skipped", "retry")
    assert worker_a.result() in ("retry", "skipped")
    relay_until_settled()

    channel = slack.channel_messages(CHANNEL)
    assert len(channel) == 1  # exactly once
    assert len(slack.attempts("chat.postMessage")) == 1
    reply.refresh_from_db()
    assert (reply.relay_status, reply.slack_ts) == (Reply.RelayStatus.POSTED, channel[0]["ts"])
    assert not Message.objects.exists()
    assert responded(notification)
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_paused_past_its_claim_sends_nothing(folder_store, notification, slack, settings):
    """Issue 21.7: a worker stopped between its claim and its post (a long GC pause, a frozen
    VM) must not send the post after another worker may have taken the claim over and read
    the history: once the claim timeout has passed, no Slack call of the attempt is sent."""
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.3
    reply = accepted_instruction(folder_store, notification)
    claim = reply_relay_claim(reply_id=reply.pk)
    assert claim is not None
    time.sleep(0.35)  # the pause

    result = reply_relay_slack(claim)

    assert result.outcome == "refused" and "not sent" in result.error
    assert slack.calls == []
    assert reply_relay_record(claim=claim, result=result) == "retry"
    relay_until_settled()
    assert len(slack.channel_messages(CHANNEL)) == 1
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED


# --- no silent loss of instruction text (issue 10, point 6) --------------------------------

CUT_BODY = "Please recruit\n> 50 participants\nper site.\n\n__\nAnd drop section 4 <b>now</b>."


@pytest.mark.django_db(transaction=True)
def test_text_the_parser_cut_is_kept_and_the_slack_post_says_so(folder_store, notification, slack):
    """Issue 10.6: a line starting with `>` and the text after an underscore line were
    dropped without a trace. They are kept on the Reply and the post tells the team."""
    reply = accepted_instruction(folder_store, notification, body=CUT_BODY)
    assert reply.instruction == "Please recruit\nper site."
    assert "> 50 participants" in reply.stripped_text
    assert "And drop section 4 <b>now</b>." in reply.stripped_text
    assert reply.cut_lines == 3

    relay_until_settled()

    text = slack.channel_messages(CHANNEL)[0]["text"]
    assert text.endswith(
        f"[3 lines of quoted/trailing text were not relayed; see reply #{reply.pk} in the admin]"
    )
    assert "50 participants" not in text and "drop section 4" not in text


@pytest.mark.django_db(transaction=True)
def test_text_the_parser_cut_is_noted_in_the_database_inbox_message(folder_store, notification):
    reply = accepted_instruction(folder_store, notification, body=CUT_BODY)

    run_pending()

    message = Message.objects.get()
    assert message.text == (
        "Please recruit\nper site.\n"
        f"[3 lines of quoted/trailing text were not relayed; see reply #{reply.pk} in the admin]"
    )
    assert message.metadata["cut_lines"] == 3


@pytest.mark.django_db(transaction=True)
def test_only_the_quote_of_our_mail_stripped_adds_no_note(folder_store, notification, slack):
    reply = accepted_instruction(folder_store, notification)  # build_mail quotes our mail
    assert reply.stripped_text.startswith("On Mon, 1 Dec 2026, Assistant wrote:")
    assert reply.cut_lines == 0
    relay_until_settled()
    assert "not relayed" not in slack.channel_messages(CHANNEL)[0]["text"]


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


@pytest.mark.django_db(transaction=True)
def test_a_posted_relay_whose_record_rolls_back_keeps_the_mail_in_the_intake(
    folder_store, notification, slack
):
    """Mutant: the Slack path calling inbound_email_finalize inside the record's transaction
    instead of on_commit. A record that then fails to commit would leave the row waiting for
    the relay with its mail already gone from the intake."""
    reply = accepted_instruction(folder_store, notification)
    claim = reply_relay_claim(reply_id=reply.pk, now=timezone.now())
    assert claim is not None
    ts = post_message(
        channel=claim.channel, text=claim.text, metadata=relay_metadata(claim.reply_id)
    )

    with pytest.raises(CommitFailed), transaction.atomic():
        assert reply_relay_record(claim=claim, result=RelayResult("posted", ts=ts)) == "posted"
        raise CommitFailed

    row = InboundEmail.objects.get()
    assert (row.status, row.intake_deleted) == (Status.AWAITING_RELAY, False)
    assert intake_keys(folder_store) == ["m"]
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTING
    assert not responded(notification)

    assert reply_relay_record(claim=claim, result=RelayResult("posted", ts=ts)) == "posted"
    row.refresh_from_db()
    assert (row.status, row.intake_deleted) == (Status.PROCESSED, True)
    assert intake_keys(folder_store) == []
    assert responded(notification)
    assert len(slack.channel_messages(CHANNEL)) == 1
