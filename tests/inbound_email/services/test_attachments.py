"""Attachments of accepted replies (issue 21.1): stored under the store's attachments prefix,
recorded on the reply, relayed with the instruction (Slack thread through the local Slack
server's files_upload_v2 flow, or the database inbox with an admin download), and a mail
whose attachment was not fully handled keeps its raw source."""

from __future__ import annotations

import hashlib

import pytest
from django.urls import reverse

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.poller import poll_once
from inbound_email.services.relay import reply_relay
from jobs import run_pending
from tests.inbound_email.services.test_relay import CHANNEL, relay_until_settled, responded
from tests.inbound_email.test_attachments import HOSTILE_NAME
from tests.support.mail import PDF, PNG, build_mail, with_attachments
from tests.support.slack_server import SlackServer
from tests.support.stores import intake_keys, key

State = ReplyAttachment.State
BODY = "Please see my comments attached."


def reply_with_attachments(store, notification, *, body: str = BODY, **kinds) -> bytes:
    """A reply with a PDF whose name is hostile, an inline image and an attached mail."""
    kinds = {"pdf_name": "PLACEHOLDER.pdf", "inline_image": True, "forwarded": True, **kinds}
    raw = build_mail(token=notification.token, body=body, attach=with_attachments(**kinds))
    raw = raw.replace(b'filename="PLACEHOLDER.pdf"', HOSTILE_NAME)
    store.put(key(store, "m"), raw)
    return raw


@pytest.mark.django_db(transaction=True)
def test_attachments_are_stored_recorded_and_listed_in_the_inbox_with_an_admin_download(
    store, notification, admin_client
):
    """Issue 21.1: the attachment was dropped, the mail deleted and its raw cleared, and
    nothing recorded that there was one. Slack off: each is stored under attachments/,
    recorded with its sanitised name, type, size and sha256, and listed in the database
    inbox with an admin download that gives back its bytes."""
    reply_with_attachments(store, notification)
    poll_once()
    reply = Reply.objects.get()
    rows = list(reply.attachments.order_by("index"))
    assert [(r.filename, r.content_type, r.state, r.inline) for r in rows] == [
        ("figure 1.png", "image/png", State.STORED, True),
        ("evilreport.pdf", "application/pdf", State.STORED, False),
        ("My comments on the budget.eml", "message/rfc822", State.STORED, False),
    ]
    mail = InboundEmail.objects.get()
    for row, data in zip(rows[:2], [PNG, PDF], strict=True):
        assert (row.size, row.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert row.store_key == f"attachments/{mail.pk}/{row.index}-{row.filename}"
        assert store.get(row.store_key) == data
    assert b"travel budget" in store.get(rows[2].store_key)
    assert intake_keys(store) == [key(store, "m")]  # attachments are never taken for mail

    run_pending()

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.INBOXED and not reply.needs_operator
    message = Message.objects.get()
    assert message.text.startswith(BODY)
    for row in rows:
        download = reverse("admin:inbound_email_replyattachment_download", args=[row.pk])
        assert f"{row.filename} ({row.content_type}, {row.size} bytes, sha256 {row.sha256})" in (
            message.text
        )
        assert download in message.text
        response = admin_client.get(download)
        assert response.status_code == 200
        assert b"".join(response.streaming_content if response.streaming else [response.content])
        assert response["Content-Type"] == "application/octet-stream"
        assert response["Content-Disposition"].startswith("attachment;")
        assert response["X-Content-Type-Options"] == "nosniff"
    assert (
        admin_client.get(
            reverse("admin:inbound_email_replyattachment_download", args=[rows[1].pk])
        ).content
        == PDF
    )
    assert [a["sha256"] for a in message.metadata["attachments"]] == [r.sha256 for r in rows]
    assert all(r.relayed_at for r in reply.attachments.all())
    mail.refresh_from_db()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.raw is None  # all handled
    assert intake_keys(store) == []
    assert responded(notification)


@pytest.mark.django_db(transaction=True)
def test_attachments_are_shared_once_in_the_thread_of_the_instruction(
    folder_store, notification, slack
):
    """With Slack on, the attachments follow the instruction into its thread: slack-sdk's
    files_upload_v2 (files.getUploadURLExternal, the upload to the URL it gave, one
    files.completeUploadExternal)."""
    reply_with_attachments(folder_store, notification)
    poll_once()

    relay_until_settled()

    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.POSTED and not reply.needs_operator
    top = [m for m in slack.channel_messages(CHANNEL) if "thread_ts" not in m]
    assert len(top) == 1 and top[0]["ts"] == reply.slack_ts
    assert BODY in top[0]["text"] and "[3 attachments in the thread below]" in top[0]["text"]
    shared = slack.shared_files(CHANNEL)
    assert [(f["name"], f["thread_ts"]) for f in shared] == [
        ("figure 1.png", reply.slack_ts),
        ("evilreport.pdf", reply.slack_ts),
        ("My comments on the budget.eml", reply.slack_ts),
    ]
    assert len({f["message_ts"] for f in shared}) == 1  # one message shares them all
    assert slack.uploaded(shared[0]["id"]) == PNG and slack.uploaded(shared[1]["id"]) == PDF
    assert len(slack.attempts("files.getUploadURLExternal")) == 3
    assert len(slack.attempts("upload")) == 3
    assert len(slack.attempts("files.completeUploadExternal")) == 1
    rows = list(reply.attachments.order_by("index"))
    assert [r.slack_file_id for r in rows] == [f["id"] for f in shared]
    assert all(r.relayed_at for r in rows)
    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.raw is None
    assert intake_keys(folder_store) == []
    assert not Message.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(SlackServer.error_after_post(500), id="500-after-sharing"),
        pytest.param(SlackServer.reset_after_post(), id="connection-reset-after-sharing"),
        # Slack shows the files only after the claim timeout (0.3 s), within the next one.
        pytest.param(SlackServer.late(0.45), id="shown-after-the-claim-timeout"),
    ],
)
def test_an_unknown_outcome_of_the_sharing_is_looked_up_never_shared_twice(
    folder_store, notification, slack, settings, failure
):
    """The same claim / look-up / record rules as the post: Slack showed the files but the
    answer was lost; the thread is searched for the sharing message, not shared again."""
    settings.INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = 0.3  # an unsure share waited for 0.6 s
    slack.script(failure, method="files.completeUploadExternal")
    reply_with_attachments(folder_store, notification, inline_image=False, forwarded=False)
    poll_once()

    relay_until_settled()

    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.POSTED
    assert [f["name"] for f in slack.shared_files(CHANNEL)] == ["evilreport.pdf"]
    assert len(slack.attempts("files.completeUploadExternal")) == 1
    assert len(slack.attempts("conversations.replies")) == 1
    assert reply.attachments.get().relayed_at is not None
    assert InboundEmail.objects.get().raw is None
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("slack_on", [False, True], ids=["inbox", "slack"])
def test_an_attachment_over_the_limit_is_kept_in_raw_and_the_raw_is_not_cleared(
    folder_store, notification, settings, request, slack_on
):
    """Issue 21.1: an attachment over INBOUND_EMAIL_MAX_ATTACHMENT_BYTES is recorded as
    "kept in raw, too large", said in the relayed message, and its mail's raw source is
    kept although the mail is processed."""
    slack = request.getfixturevalue("slack") if slack_on else None
    settings.INBOUND_EMAIL_MAX_ATTACHMENT_BYTES = 4096
    big = b"\x00\x01" * 4096  # 8,192 bytes
    raw = reply_with_attachments(
        folder_store,
        notification,
        inline_image=False,
        forwarded=False,
        extra=[("scan.tiff", big, "image/tiff")],
    )
    poll_once()
    relay_until_settled()

    reply = Reply.objects.get()
    pdf, scan = reply.attachments.order_by("index")
    assert (pdf.state, pdf.size) == (State.STORED, len(PDF))  # within the limit
    assert (scan.state, scan.size, scan.store_key) == (State.TOO_LARGE, len(big), "")
    assert scan.sha256 == hashlib.sha256(big).hexdigest()
    assert scan.get_state_display() == "Kept in raw, too large"
    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED
    assert bytes(mail.raw) == raw  # kept: the attachment is only there
    assert "raw source kept" in mail.detail
    note = "\u201cscan.tiff\u201d (8192 bytes) kept in raw, too large: see reply #"
    if slack_on:
        text = slack.channel_messages(CHANNEL)[0]["text"]
        assert note in text
        assert [f["name"] for f in slack.shared_files(CHANNEL)] == ["evilreport.pdf"]
    else:
        text = Message.objects.get().text
        assert "scan.tiff" in text and "Kept in raw, too large" in text
        assert reverse("admin:inbound_email_inboundemail_raw", args=[mail.pk]) in text
    assert intake_keys(folder_store) == []


@pytest.mark.django_db(transaction=True)
def test_attachments_past_the_count_limit_are_kept_in_raw(folder_store, notification, settings):
    settings.INBOUND_EMAIL_MAX_ATTACHMENTS = 1
    reply_with_attachments(folder_store, notification)
    poll_once()
    run_pending()

    states = list(Reply.objects.get().attachments.order_by("index").values_list("state", flat=True))
    assert states == [State.STORED, State.TOO_MANY, State.TOO_MANY]
    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.raw is not None


@pytest.mark.django_db(transaction=True)
def test_attachments_slack_never_takes_are_left_for_an_operator_with_the_raw_kept(
    folder_store, notification, slack, settings
):
    """Slack refuses the sharing every time: once their own budget is spent, the reply is
    posted (its instruction is in Slack) but flagged for an operator, the files stay
    downloadable, and the mail's raw source is kept: its content was not fully handled."""
    settings.INBOUND_RELAY_MAX_ATTEMPTS = 2
    slack.defaults["files.completeUploadExternal"] = SlackServer.error("not_allowed")
    reply_with_attachments(folder_store, notification, inline_image=False, forwarded=False)
    poll_once()

    relay_until_settled()

    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.POSTED and reply.needs_operator
    assert "attachment(s) were never shared" in reply.relay_last_error
    assert len(slack.attempts("files.completeUploadExternal")) == 2
    assert slack.shared_files(CHANNEL) == []
    assert len(slack.channel_messages(CHANNEL)) == 1  # the instruction, once
    assert reply.attachments.get().relayed_at is None
    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.raw is not None
    assert not Message.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_slack_turned_off_after_the_post_lists_only_the_attachments_in_the_inbox(
    folder_store, notification, slack, settings
):
    """The instruction is in Slack; its attachments were not shared yet when Slack was
    turned off: they go to the inbox, never the instruction a second time."""
    slack.defaults["files.completeUploadExternal"] = SlackServer.error("not_allowed")
    settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 60
    reply_with_attachments(folder_store, notification, inline_image=False, forwarded=False)
    poll_once()
    run_pending()  # the instruction is posted
    run_pending()  # the sharing is refused; the next try is a minute away
    reply = Reply.objects.get()
    assert reply.slack_ts and reply.relay_status == Reply.RelayStatus.PENDING

    settings.SLACK_BOT_TOKEN = ""
    Reply.objects.update(relay_next_attempt_at=None)
    assert reply_relay(reply_id=reply.pk) == "inboxed"

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.POSTED and reply.needs_operator
    text = Message.objects.get().text
    assert text.startswith(f"Attachments of reply #{reply.pk} (its instruction is in Slack")
    assert "evilreport.pdf" in text and BODY not in text
    assert reply.attachments.get().relayed_at is not None
    assert InboundEmail.objects.get().raw is None


@pytest.mark.django_db(transaction=True)
def test_a_body_longer_than_was_read_keeps_the_raw_of_a_processed_mail(folder_store, notification):
    """No mail whose content was not fully handled has its raw cleared: a rating whose body
    runs past what the reader keeps is processed at once, the body recorded as kept in raw."""
    from inbound_email.parsing import MAX_BODY_CHARS

    signature = "\n".join(["Prof. Ada Lovelace, Analytical Engines"] * (MAX_BODY_CHARS // 30))
    raw = build_mail(token=notification.token, body=f"4\n\n-- \n{signature}\nEND")
    folder_store.put("m", raw)
    poll_once()

    reply = Reply.objects.get()
    assert (reply.rating, reply.relay_status) == (4, Reply.RelayStatus.NONE)
    record = reply.attachments.get()
    assert (record.filename, record.state, record.store_key) == (
        "message-body.txt",
        State.BODY_CUT,
        "",
    )
    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and bytes(mail.raw) == raw
    assert intake_keys(folder_store) == []
