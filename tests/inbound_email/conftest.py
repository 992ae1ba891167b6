"""Fixtures of the inbound-email tests: stores (folder, moto S3), Slack server, notifications."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta

import boto3
import pytest
from django.utils import timezone
from model_bakery import baker
from moto import mock_aws

from inbound_email import stores
from inbound_email.stores import FolderStore, S3Store, store_from_url
from notifications.models import EmailNotification
from tests.support.mail import PI_ADDRESS
from tests.support.slack_server import SlackServer
from tests.support.stores import BUCKET, PREFIX


@pytest.fixture(autouse=True)
def _inbound_settings(settings, tmp_path):
    stores._default_cache.clear()  # each test has its own store (folder, moto bucket)
    settings.SLACK_BOT_TOKEN = ""
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "mail")
    settings.INBOUND_EMAIL_RETRY_BASE_SECONDS = 0
    settings.INBOUND_RELAY_BACKOFF_BASE_SECONDS = 0
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 5
    settings.INBOUND_EMAIL_MAX_ATTEMPTS = 3


@pytest.fixture
def folder_store(settings) -> FolderStore:
    store = store_from_url()
    assert isinstance(store, FolderStore)
    return store


@pytest.fixture
def aws_env(monkeypatch) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def s3_store(settings, aws_env) -> Iterator[S3Store]:
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        settings.INBOUND_EMAIL_STORE = f"s3://{BUCKET}/{PREFIX.rstrip('/')}"
        store = store_from_url()
        assert isinstance(store, S3Store)
        yield store


@pytest.fixture(params=["folder", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def slack(settings) -> Iterator[SlackServer]:
    with SlackServer() as server:
        settings.SLACK_BOT_TOKEN = "xoxb-test-token"
        settings.SLACK_API_URL = server.base_url
        settings.SLACK_TIMEOUT = 5
        yield server


_seq = itertools.count(1)


@pytest.fixture
def make_notification():
    def make(**overrides) -> EmailNotification:
        now = timezone.now()
        user = overrides.pop("user", None) or baker.make(
            "auth.User", username=f"pi{next(_seq)}", first_name="Ada", last_name="Lovelace"
        )
        proposal = overrides.pop("proposal", None) or baker.make(
            "notifications.Proposal",
            pi=user,
            title="Quantum sensing of soil moisture",
            run_id="run-42",
            slack_channel="C0PROPOSAL",
        )
        fields = {
            "user": user,
            "proposal": proposal,
            "kind": EmailNotification.Kind.PROPOSAL_REVIEW,
            "status": EmailNotification.Status.SENT,
            "to_address": PI_ADDRESS,
            "sent_at": now - timedelta(hours=1),
            "ses_message_id": f"0100018f-ses-{next(_seq)}",
            "expires_at": now + timedelta(days=7),
        }
        fields.update(overrides)
        return baker.make(EmailNotification, **fields)

    return make


@pytest.fixture
def notification(make_notification) -> EmailNotification:
    return make_notification()
