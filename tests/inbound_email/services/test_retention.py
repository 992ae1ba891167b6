"""Retention (issue 21, point 5): junk keeps little, and only for a while.

Rejected mail keeps its headers and the first 64 KiB of its raw source, the rest dropped when
it is rejected; finished rows past INBOUND_RETENTION_DAYS are pruned in batches by the hourly
schedule; quarantined mail is kept until an operator acts.
"""

from __future__ import annotations

from datetime import timedelta
from email import message_from_bytes, policy

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule
from model_bakery import baker

from inbound_email.exceptions import MailNotInState
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.actions import inbound_email_reprocess
from inbound_email.services.retention import inbound_email_prune
from inbound_email.tasks import prune_inbound_email
from tests.support.mail import build_mail
from tests.support.stores import intake_keys

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status
Reason = InboundEmail.Reason
KIB = 1024


def junk(size: int, **kwargs) -> bytes:
    """A mail of about `size` bytes: a real header block, then filler text."""
    head = build_mail(**kwargs)
    filler = b"Cheap grants, apply today! " * (size // 27 + 1)
    return head + b"\n" + filler[: max(size - len(head) - 1, 0)]


def test_rejected_junk_keeps_its_headers_and_only_the_first_64_kib_of_raw(folder_store):
    raw = junk(1024 * KIB)  # no token: rejected on its headers
    folder_store.put("junk", raw)
    poll_once()

    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, Reason.NO_TOKEN)
    assert bytes(row.raw) == raw[: 64 * KIB]  # the first bytes, the rest dropped at once
    assert row.size == len(raw)  # what it was, so the cut shows
    assert "From: Ada Lovelace" in row.headers_text
    assert intake_keys(folder_store) == []  # and the intake copy is gone


def test_the_dropped_bytes_never_reach_the_database(folder_store):
    """Dropped at once means never written: a full copy written first and cut later stays in
    the table as a dead row version until vacuum (1.1 MiB a junk mail instead of 70 KiB,
    measured by bench/retention.py)."""
    written: list[int] = []

    def record(execute, sql, params, many, context):
        for param in params or ():
            value = getattr(param, "obj", param)  # psycopg's Binary wraps the bytes
            if isinstance(value, bytes | bytearray | memoryview):
                written.append(len(value))
        return execute(sql, params, many, context)

    folder_store.put("junk", junk(1024 * KIB))
    with connection.execute_wrapper(record):
        poll_once()

    assert InboundEmail.objects.get().reason == Reason.NO_TOKEN
    assert written and max(written) <= 64 * KIB


def test_a_rejected_reply_smaller_than_the_limit_is_kept_whole(folder_store, notification):
    raw = build_mail(token=notification.token, sender="someone.else@example.org")
    folder_store.put("mismatch", raw)
    poll_once()
    row = InboundEmail.objects.get()
    assert row.reason == Reason.SENDER_MISMATCH
    assert bytes(row.raw) == raw


def test_the_kept_bytes_are_a_setting(folder_store, settings):
    settings.INBOUND_EMAIL_REJECTED_RAW_BYTES = 1000
    folder_store.put("junk", junk(200 * KIB))
    poll_once()
    assert len(InboundEmail.objects.get().raw) == 1000


def test_a_cut_mail_is_never_reprocessed_from_its_first_bytes(folder_store):
    folder_store.put("junk", junk(200 * KIB))
    poll_once()
    row = InboundEmail.objects.get()
    with pytest.raises(MailNotInState, match="kept only the first 65536 of its"):
        inbound_email_reprocess(inbound_email_id=row.pk, store=folder_store)
    row.refresh_from_db()
    assert row.status == Status.REJECTED


def test_quarantined_mail_keeps_its_whole_raw_source(folder_store, notification, settings):
    settings.INBOUND_EMAIL_MAX_MIME_PARTS = 2
    msg = message_from_bytes(build_mail(token=notification.token), policy=policy.default)
    for n in range(3):
        msg.add_attachment(b"%d" % n * 40 * KIB, maintype="application", subtype="pdf")
    raw = msg.as_bytes()
    folder_store.put("q", raw)
    poll_once()
    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.MIME_PARTS_LIMIT)
    assert bytes(row.raw) == raw  # kept whole until an operator acts


def _finished(status: str, days_ago: float, **fields) -> InboundEmail:
    row = baker.make(InboundEmail, status=status, raw=b"x" * 100, **fields)
    InboundEmail.objects.filter(pk=row.pk).update(
        finished_at=timezone.now() - timedelta(days=days_ago)
    )
    return row


def test_finished_rows_past_the_retention_are_pruned_and_nothing_else(notification):
    old_rejected = _finished(Status.REJECTED, 31)
    old_processed = _finished(Status.PROCESSED, 45)
    old_discarded = _finished(Status.DISCARDED, 31)
    young_rejected = _finished(Status.REJECTED, 29)
    old_quarantined = _finished(Status.QUARANTINED, 400)  # kept until an operator acts
    waiting = baker.make(InboundEmail, status=Status.RECEIVED)
    InboundEmail.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(90))
    relaying = _finished(Status.AWAITING_RELAY, 60)
    with_reply = _finished(Status.PROCESSED, 60)  # the record of a PI's answer
    baker.make(Reply, inbound_email=with_reply, notification=notification, rating=4)
    duplicate = _finished(Status.REJECTED, 5, duplicate_of=old_rejected)

    assert inbound_email_prune() == 3

    left = set(InboundEmail.objects.values_list("pk", flat=True))
    assert left == {
        young_rejected.pk,
        old_quarantined.pk,
        waiting.pk,
        relaying.pk,
        with_reply.pk,
        duplicate.pk,
    }
    assert not {old_rejected.pk, old_processed.pk, old_discarded.pk} & left
    duplicate.refresh_from_db()
    assert duplicate.duplicate_of is None  # its original is gone; the duplicate stays


def test_the_retention_is_a_setting(settings):
    settings.INBOUND_RETENTION_DAYS = 7
    _finished(Status.REJECTED, 8)
    kept = _finished(Status.REJECTED, 6)
    assert prune_inbound_email() == 1
    assert list(InboundEmail.objects.values_list("pk", flat=True)) == [kept.pk]


def test_pruning_runs_in_batches_until_done():
    for _ in range(25):
        _finished(Status.REJECTED, 40)
    assert inbound_email_prune(batch_size=10) == 25
    assert not InboundEmail.objects.exists()


def test_pruning_stops_at_its_time_budget_and_the_next_run_carries_on():
    for _ in range(25):
        _finished(Status.REJECTED, 40)
    assert inbound_email_prune(batch_size=10, max_seconds=0) == 10
    assert InboundEmail.objects.count() == 15
    assert inbound_email_prune(batch_size=10) == 15


def test_the_prune_is_scheduled_hourly():
    call_command("setup_schedules")
    schedule = Schedule.objects.get(func="inbound_email.tasks.prune_inbound_email")
    assert schedule.minutes == 60
