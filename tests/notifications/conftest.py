"""Fixtures of the notification tests: PIs with proposals in review, SES through moto."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from django.contrib.auth import get_user_model
from model_bakery import baker
from moto import mock_aws

from notifications import sns_certificates
from notifications.models import NotificationPreference, Proposal
from tests.support.ses import REGION, MotoSes
from tests.support.sns import TOPIC, SnsSigner


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SES", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ses_unverified(aws_env: None, settings: Any) -> Iterator[MotoSes]:
    """SES (moto) on which our sender identity is not verified: SES rejects every send."""
    settings.EMAIL_SENDER = "ses"
    settings.SES_REGION = REGION
    # moto's GetSendQuota reports a sandbox account (1 mail a second): paced to it, a test of
    # anything else would wait a second per mail (test_pacing.py tests the pace).
    settings.NOTIFICATION_SEND_RATE = 1e6
    with mock_aws():
        yield MotoSes(boto3.client("ses", region_name=REGION))


@pytest.fixture
def ses(ses_unverified: MotoSes) -> MotoSes:
    """SES (moto) that accepts mail from DEFAULT_FROM_EMAIL."""
    ses_unverified.verify_sender()
    return ses_unverified


@pytest.fixture
def signer(settings: Any) -> Iterator[SnsSigner]:
    """/ses/events on, believing the local test certificate (tests/support/sns.py), with
    empty certificate caches."""
    settings.SES_EVENTS_TOPIC_ARNS = [TOPIC]
    settings.SES_EVENTS_FETCH_DEADLINE_SECONDS = 5
    with SnsSigner() as signer:
        settings.SES_EVENTS_TRUSTED_CERT_URLS = [signer.cert_url]
        sns_certificates.forget_certificates()
        yield signer
    sns_certificates.forget_certificates()


@pytest.fixture
def make_pi(db: None) -> Callable[..., Any]:
    """A user with `proposals` proposals in review, on `rung` (None: no preference row yet)."""
    counter = iter(range(1, 1_000_000))

    def make(*, proposals: int = 1, rung: str | None = None, **user_fields: Any) -> Any:
        n = next(counter)
        fields = {"username": f"pi{n}", "email": f"pi{n}@example.org", "is_active": True}
        user = baker.make(get_user_model(), **{**fields, **user_fields})
        if rung is not None:
            baker.make(NotificationPreference, user=user, rung=rung, consecutive_missed=0)
        for index in range(proposals):
            baker.make(
                Proposal, pi=user, title=f"Proposal {n}.{index}", status=Proposal.Status.IN_REVIEW
            )
        return user

    return make
