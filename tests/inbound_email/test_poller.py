"""The poll loop end to end: store -> ledger -> reply -> outcome, on the folder store and S3."""

from __future__ import annotations

import boto3
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from notifications.models import EmailNotification
from tests.support.mail import build_mail
from tests.support.stores import BUCKET, PREFIX, intake_keys, key

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


# One object past S3's 1,000-key page: the second page holds it (it held 500 before issue 36:
# the same proof, at a third less of the suite's slowest test, CPU-bound in moto and intake).
PAST_ONE_PAGE = 1001


@pytest.mark.slow
def test_1001_objects_in_one_run_paginate_past_1000(s3_store, notification, settings):
    """I9: the listing is paginated; the old poller read one page (MaxKeys=50) only."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 10_000
    client = boto3.client("s3")
    body = build_mail(token=notification.token, body="3")
    # Written into moto's bucket directly: the set-up, not the poller, need not pay 1,001
    # signed requests through botocore (the poller's listing and reads still go through it).
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(PAST_ONE_PAGE):
        backend.put_object(
            BUCKET,
            f"{PREFIX}{i:05d}",
            body.replace(b"Message-ID: <", f"Message-ID: <{i}-".encode(), 1),
        )
    assert client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["KeyCount"] == 1000  # one page

    summary = poll_once()

    assert summary.listed == PAST_ONE_PAGE
    assert summary.handled == PAST_ONE_PAGE
    assert InboundEmail.objects.filter(status=Status.PROCESSED).count() == PAST_ONE_PAGE
    assert Reply.objects.filter(rating=3).count() == PAST_ONE_PAGE
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
