"""notifications/checks.py: an SES sender needs a region at start-up, not at the first send."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks


@pytest.fixture
def no_aws_region(monkeypatch):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")


def _ids() -> list[str]:
    return [message.id for message in run_checks() if message.is_serious()]


def test_ses_without_any_region_is_an_error_naming_the_variables(settings, no_aws_region):
    settings.EMAIL_SENDER = "ses"
    settings.SES_REGION = ""
    [error] = [m for m in run_checks() if m.id == "notifications.E001"]
    assert "EMAIL_SENDER=ses" in error.msg
    assert "SES_REGION" in error.hint


def test_ses_with_a_region_from_the_setting_or_the_environment_passes(
    settings, no_aws_region, monkeypatch
):
    settings.EMAIL_SENDER = "ses"
    settings.SES_REGION = "eu-west-1"
    assert "notifications.E001" not in _ids()
    settings.SES_REGION = ""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert "notifications.E001" not in _ids()


def test_the_django_sender_needs_no_region(settings, no_aws_region):
    settings.EMAIL_SENDER = "django"
    assert "notifications.E001" not in _ids()
