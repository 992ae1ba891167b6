"""The poll loop end to end: store -> ledger -> reply -> outcome, on the folder store and S3."""

from __future__ import annotations

from datetime import timedelta

import boto3
import pytest
from django.db import connection
from django.utils import timezone

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from jobs import run_pending
from notifications.models import EmailNotification
from tests.support.mail import PI_ADDRESS, build_mail
from tests.support.stores import BUCKET, PREFIX, FlakyStore, intake_keys, key

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status
Reason = InboundEmail.Reason


def test_rating_only_reply_is_processed_and_deleted(store, notification):
    store.put(key(store, "m1"), build_mail(token=notification.token, body="Rating: 4 stars"))

    summary = poll_once()

    row = InboundEmail.objects.get(store_key=key(store, "m1"))
    assert (row.status, row.reason) == (Status.PROCESSED, "")
    assert row.reply.rating == 4
    assert row.reply.relay_status == Reply.RelayStatus.NONE
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.RESPONDED
    assert intake_keys(store) == []
    assert row.raw is None  # nothing depends on the bytes any more
    assert summary.handled == 1


UNKNOWN_8BIT_MAIL = (
    b"From: Ada Lovelace <" + PI_ADDRESS.encode() + b">\r\n"
    b"To: replies+%s@reply.localhost\r\n"
    b"Subject: Re: caf\xe9 proposal\r\n"
    b"Message-ID: <pill-1@university.example>\r\n"
    b"MIME-Version: 1.0\r\n"
    b"Content-Type: text/plain; charset=unknown-8bit\r\n"
    b"Content-Transfer-Encoding: 8bit\r\n\r\n"
    b"Rating: 5\r\nMerci, the caf\xe9 budget line is fine.\r\n"
)


def test_cor19_poison_pills_are_handled_and_never_fetched_again(
    s3_store, make_notification, django_capture_on_commit_callbacks
):
    """COR-19: charset=unknown-8bit raised LookupError and a string rating raised TypeError;
    neither object was deleted, so both were fetched and failed on every poll, forever.

    Now the first decodes with a fallback (cp1252 -> "café") and is processed, the second is
    rejected with a reason, and a second poll fetches neither again.
    """
    first, second = make_notification(), make_notification()
    s3_store.put(PREFIX + "pill-charset", UNKNOWN_8BIT_MAIL.replace(b"%s", first.token.encode()))
    s3_store.put(
        PREFIX + "pill-rating",
        build_mail(token=second.token, body="Rating: excellent", message_id="<pill-2@x.example>"),
    )

    poll_once()
    with django_capture_on_commit_callbacks(execute=True):
        run_pending()  # relays the instruction (Slack off: to the database inbox)

    charset_row = InboundEmail.objects.get(store_key=PREFIX + "pill-charset")
    assert charset_row.status == Status.PROCESSED
    assert charset_row.subject == "Re: café proposal"
    assert charset_row.reply.rating == 5
    assert "café budget line" in charset_row.reply.instruction
    rating_row = InboundEmail.objects.get(store_key=PREFIX + "pill-rating")
    assert (rating_row.status, rating_row.reason) == (Status.REJECTED, Reason.INVALID_RATING)
    assert "'Rating: excellent' is not a number 1-5" in rating_row.detail
    assert intake_keys(s3_store) == []

    attempts_before = {r.pk: r.attempts for r in InboundEmail.objects.all()}
    again = poll_once()
    assert again.listed == 0 and again.handled == 0
    assert {r.pk: r.attempts for r in InboundEmail.objects.all()} == attempts_before


def test_string_rating_is_coerced(store, notification):
    store.put(
        key(store, "m"), build_mail(token=notification.token, body="Rating: 4/5\nAdd a timeline.")
    )
    poll_once()
    reply = Reply.objects.get()
    assert (reply.rating, reply.instruction) == (4, "Add a timeline.")


@pytest.mark.slow
def test_1500_objects_in_one_run_paginate_past_1000(s3_store, notification, settings):
    """I9: the listing is paginated; the old poller read one page (MaxKeys=50) only."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 10_000
    client = boto3.client("s3")
    body = build_mail(token=notification.token, body="3")
    for i in range(1500):
        client.put_object(
            Bucket=BUCKET,
            Key=f"{PREFIX}{i:05d}",
            Body=body.replace(b"Message-ID: <", f"Message-ID: <{i}-".encode(), 1),
        )

    summary = poll_once()

    assert summary.listed == 1500
    assert summary.handled == 1500
    assert InboundEmail.objects.filter(status=Status.PROCESSED).count() == 1500
    assert Reply.objects.filter(rating=3).count() == 1500
    assert client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["KeyCount"] == 0


def test_a_run_is_bounded_and_the_next_run_continues(folder_store, notification, settings):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 100
    for i in range(7):
        folder_store.put(f"m{i}", build_mail(token=notification.token, body="2"))
    first = poll_once(limit=5)
    assert (first.handled, first.limit_reached) == (5, True)
    second = poll_once(limit=5)
    assert second.handled == 2
    assert InboundEmail.objects.filter(status=Status.PROCESSED).count() == 7


def test_ses_setup_notification_and_folder_keys_are_skipped(s3_store):
    client = boto3.client("s3")
    client.put_object(Bucket=BUCKET, Key=PREFIX + "AMAZON_SES_SETUP_NOTIFICATION", Body=b"x")
    client.put_object(Bucket=BUCKET, Key=PREFIX + "sub/", Body=b"")
    assert poll_once().listed == 0
    assert not InboundEmail.objects.exists()


# --- acceptance 4: each rejection with its reason ------------------------------------------


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


def test_duplicate_message_id_is_handled_once(store, notification):
    mail = build_mail(token=notification.token, body="4", message_id="<same@university.example>")
    store.put(key(store, "copy-a"), mail)
    store.put(key(store, "copy-b"), mail)
    poll_once()
    a, b = InboundEmail.objects.order_by("store_key")
    assert (a.status, b.status) == (Status.PROCESSED, Status.REJECTED)
    assert (b.reason, b.duplicate_of) == (Reason.DUPLICATE, a)
    assert Reply.objects.count() == 1


def test_redelivered_object_with_the_same_key_is_handled_once(store, notification):
    mail = build_mail(token=notification.token, body="4")
    store.put(key(store, "k"), mail)
    poll_once()
    store.put(key(store, "k"), mail)  # SES redelivers the same object
    summary = poll_once()
    assert summary.outcomes["cleaned_up"] == 1
    assert InboundEmail.objects.count() == 1 and Reply.objects.count() == 1
    assert intake_keys(store) == []


# --- poison: errors counted, quarantine, oversize -----------------------------------------


def test_transient_errors_retry_then_quarantine_after_max_attempts(folder_store, notification):
    folder_store.put("t", build_mail(token=notification.token))
    folder_store.put("ok", build_mail(token=notification.token, body="5"))
    flaky = FlakyStore(folder_store, failing={"t": True})

    first = poll_once(store=flaky)
    assert first.outcomes == {"received": 1, "processed": 1}  # one failure never stops a batch
    row = InboundEmail.objects.get(store_key="t")
    assert (row.status, row.attempts) == (Status.RECEIVED, 1)
    assert "simulated failure on t" in row.last_error
    poll_once(store=flaky)
    poll_once(store=flaky)

    row.refresh_from_db()
    assert (row.status, row.reason, row.attempts) == (
        Status.QUARANTINED,
        Reason.TOO_MANY_ATTEMPTS,
        3,
    )
    assert "Traceback" in row.last_error
    assert intake_keys(folder_store) == []
    assert row.quarantine_key == "quarantine/t"
    assert b"Please tighten the budget" in folder_store.get_quarantined("quarantine/t")
    gets = flaky.gets
    assert poll_once(store=flaky).listed == 0
    assert flaky.gets == gets  # never picked up again automatically


def test_permanent_error_quarantines_at_once(folder_store):
    folder_store.put("p", b"From: x@y\r\n\r\nhi")
    flaky = FlakyStore(folder_store, failing={"p": False})
    poll_once(store=flaky)
    row = InboundEmail.objects.get()
    assert (row.status, row.reason, row.attempts) == (Status.QUARANTINED, Reason.PERMANENT_ERROR, 1)
    assert "StoreError: simulated failure on p" in row.detail


def test_crashed_attempts_count_and_quarantine_unread(folder_store, notification):
    """A worker killed mid-mail leaves a claimed row; its attempts still count (I6)."""
    folder_store.put("c", build_mail(token=notification.token))
    InboundEmail.objects.create(store_key="c", attempts=3, next_attempt_at=timezone.now())
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.TOO_MANY_ATTEMPTS)
    assert intake_keys(folder_store) == []


def test_oversize_mail_is_quarantined_unread(folder_store, settings, notification):
    settings.INBOUND_EMAIL_MAX_BYTES = 2048
    folder_store.put("big", build_mail(token=notification.token, body="x" * 5000))
    flaky = FlakyStore(folder_store, failing={})
    poll_once(store=flaky)
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.OVERSIZE)
    assert flaky.gets == 0
    assert row.raw is None and row.quarantine_key == "quarantine/big"


def test_database_error_mid_mail_is_rolled_back_recorded_and_quarantined(
    folder_store, notification
):
    """A database error inside the handling (here a trigger refusing the reply insert) rolls
    back only that mail's savepoint; the failure is recorded, the batch goes on, and the
    quarantined mail keeps its headers and text for the admin."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse_boom() RETURNS trigger AS $$
            BEGIN
                IF NEW.instruction LIKE '%BOOM%' THEN RAISE EXCEPTION 'refused by test'; END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER refuse_boom BEFORE INSERT ON inbound_email_reply
                FOR EACH ROW EXECUTE FUNCTION refuse_boom();
            """
        )
    folder_store.put("a-boom", build_mail(token=notification.token, body="2\nBOOM <b>x</b>"))
    folder_store.put("b-fine", build_mail(token=notification.token, body="5"))

    summary = poll_once()

    boom = InboundEmail.objects.get(store_key="a-boom")
    assert (boom.status, boom.reason) == (Status.QUARANTINED, Reason.PERMANENT_ERROR)
    assert "refused by test" in boom.last_error
    assert "Subject: Re: Your proposal" in boom.headers_text
    assert "BOOM <b>x</b>" in boom.body_text
    assert b"BOOM <b>x</b>" in bytes(boom.raw)
    assert InboundEmail.objects.get(store_key="b-fine").status == Status.PROCESSED
    assert summary.outcomes == {"quarantined:permanent_error": 1, "processed": 1}


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
