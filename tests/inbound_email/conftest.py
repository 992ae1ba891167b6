"""Fixtures of the inbound-email tests: stores (folder, moto S3), Slack server, notifications."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

import boto3
import pytest
from django.utils import timezone
from model_bakery import baker
from moto import mock_aws

from inbound_email import stores
from inbound_email.exceptions import StoreError
from inbound_email.stores import FolderStore, S3Store, store_from_url
from notifications.models import EmailNotification
from notifications.reply_address import reply_address_for
from tests.support.slack_server import SlackServer

BUCKET = "inbound-test"
PREFIX = "inbound/"
PI_ADDRESS = "pi@university.example"


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


def build_mail(
    *,
    token: str | None = None,
    sender: str = PI_ADDRESS,
    body: str = "4\nPlease tighten the budget section.",
    subject: str = "Re: Your proposal",
    headers: dict[str, str] | None = None,
    message_id: str | None = None,
    to: str | None = None,
) -> bytes:
    """A reply as a PI's mail client would send it, as raw bytes."""
    msg = EmailMessage()
    msg["From"] = f"Ada Lovelace <{sender}>"
    msg["To"] = to or (reply_address_for(token) if token else "replies@reply.localhost")
    msg["Subject"] = subject
    msg["Date"] = format_datetime(timezone.now())
    msg["Message-ID"] = message_id or make_msgid(domain="university.example")
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(
        body + "\n\nOn Mon, 1 Dec 2026, Assistant wrote:\n> Please rate this proposal\n"
    )
    return msg.as_bytes()


def key(store, name: str) -> str:
    """The intake key of `name` in a store (S3 keys carry the intake prefix)."""
    return getattr(store, "prefix", "") + name


class FlakyStore:
    """The folder store with an S3-like failure on get() for chosen keys (the edge, not us)."""

    def __init__(self, inner, *, failing: dict[str, bool]) -> None:
        self.inner = inner
        self.failing = failing  # key -> transient?
        self.description = "flaky"
        self.gets = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        self.gets += 1
        if key in self.failing:
            raise StoreError(f"simulated failure on {key}", transient=self.failing[key])
        return self.inner.get(key)
