"""Intake: each stored object gets one ledger row, is claimed once, and ends final (handled,
rejected or quarantined with a reason) however it fails: decoding, the store, the database,
its size, a crashed worker, a second poller (inbound_email/services/intake.py)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection
from django.utils import timezone

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from jobs import run_pending
from ops.status import worker_status
from tests.support.mail import PI_ADDRESS, build_mail
from tests.support.stores import PREFIX, FlakyStore, intake_keys, key
from tests.support.threads import run_side_by_side

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status
Reason = InboundEmail.Reason

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


def test_poison_pills_are_handled_and_never_fetched_again(
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


def test_duplicate_message_id_is_handled_once(store, notification):
    mail = build_mail(token=notification.token, body="4", message_id="<same@university.example>")
    store.put(key(store, "copy-a"), mail)
    store.put(key(store, "copy-b"), mail)
    poll_once()
    a, b = InboundEmail.objects.order_by("store_key")
    assert (a.status, b.status) == (Status.PROCESSED, Status.REJECTED)
    assert (b.reason, b.duplicate_of) == (Reason.DUPLICATE, a)
    assert Reply.objects.count() == 1


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


def test_a_mail_whose_object_vanished_before_it_was_read_is_quarantined_for_an_operator(
    store, notification
):
    """A mail waiting for its retry (here after a throttled read) whose object someone else
    deleted (an operator, an S3 lifecycle rule) was never listed again, so the poller never
    looked at its row: it stayed `received` for good and nothing told an operator that a
    PI's reply was lost. Now the next complete poll claims it like any due row, finds the
    object gone and quarantines it `vanished`, which worker_status reports."""
    name = key(store, "gone")
    store.put(name, build_mail(token=notification.token, body="Rating: 4"))
    poll_once(store=FlakyStore(store, failing={name: True}))
    row = InboundEmail.objects.get(store_key=name)
    assert (row.status, row.attempts) == (Status.RECEIVED, 1)
    store.delete(name)  # not by us: an operator or a lifecycle rule

    summary = poll_once(store=store)

    row.refresh_from_db()
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.VANISHED)
    assert "vanished from the store before it was read" in row.detail
    assert row.attempts == 2 and row.finished_at is not None
    assert summary.outcomes == {"quarantined:vanished": 1}
    assert any("1 quarantined mail" in line for line in worker_status().needs_operator)
    poll_once(store=store)  # terminal: never claimed again
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.QUARANTINED, 2)


def test_a_missing_mail_folder_is_not_taken_for_vanished_mail(folder_store, notification):
    """An unmounted mail folder lists nothing, like a folder whose mail was deleted: the rows
    still to handle are retried (a transient error naming the folder), not quarantined as
    vanished, and are handled once the folder is back."""
    folder_store.put("m", build_mail(token=notification.token, body="Rating: 4"))
    poll_once(store=FlakyStore(folder_store, failing={"m": True}))
    away = folder_store.root.with_name("mail-unmounted")
    folder_store.root.rename(away)

    poll_once()

    row = InboundEmail.objects.get(store_key="m")
    assert (row.status, row.attempts) == (Status.RECEIVED, 2)
    assert "is missing" in row.last_error
    away.rename(folder_store.root)
    poll_once()
    row.refresh_from_db()
    assert row.status == Status.PROCESSED


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


@pytest.mark.django_db(transaction=True)
def test_two_pollers_at_once_handle_each_object_once(folder_store, notification, settings):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1000
    for i in range(60):
        folder_store.put(f"m{i:03d}", build_mail(token=notification.token, body="4"))
    summaries = []
    barrier = threading.Barrier(2)

    def poller() -> None:
        barrier.wait(timeout=10)
        summaries.append(poll_once())

    errors = run_side_by_side(poller, timeout=60)

    assert errors == []
    assert sum(s.handled for s in summaries) == 60  # no object handled by both
    assert Reply.objects.count() == 60
    assert set(InboundEmail.objects.values_list("status", flat=True)) == {"processed"}
    assert all(row.attempts == 1 for row in InboundEmail.objects.all())
    assert [o for page in folder_store.list() for o in page] == []


Reason = InboundEmail.Reason
ROUNDS = 4  # notifications; two replies each, limit one per hour


class LockstepStore:
    """Our folder store whose reads wait until the other poller is reading too."""

    def __init__(self, inner, barrier: threading.Barrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.description = inner.description

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        self.barrier.wait(timeout=30)
        return self.inner.get(key)


@pytest.mark.django_db(transaction=True)
def test_two_pollers_at_once_never_let_a_token_past_its_hourly_limit(
    folder_store, make_notification, settings
):
    """Mutant: the notification lookup without select_for_update (the count is then racy)."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1
    notifications = [make_notification() for _ in range(ROUNDS)]
    for n, notification in enumerate(notifications):
        for copy in "ab":  # keys sort so that each round's two mails answer one notification
            folder_store.put(
                f"r{n}{copy}", build_mail(token=notification.token, body=f"{n % 5 + 1}")
            )
    barrier = threading.Barrier(2)

    def poller() -> None:
        poll_once(store=LockstepStore(folder_store, barrier))

    errors = run_side_by_side(poller, timeout=120, on_error=barrier.abort)

    assert errors == []
    assert not barrier.broken  # every read was paired: the pollers really ran side by side
    replies = Counter(Reply.objects.values_list("notification_id", flat=True))
    assert replies == Counter({n.pk: 1 for n in notifications})  # one each, never two
    outcomes = Counter(InboundEmail.objects.values_list("status", "reason"))
    assert outcomes == {
        (Status.PROCESSED, ""): ROUNDS,
        (Status.REJECTED, Reason.RATE_LIMITED): ROUNDS,
    }
