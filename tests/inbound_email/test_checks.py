"""inbound_email/checks.py: a store URL that is no store and a Slack token that cannot be one
stop start-up (manage.py prints them on one line; `manage.py check` lists them)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks


def _errors(prefix: str) -> list:
    return [m for m in run_checks() if m.id and m.id.startswith(prefix)]


@pytest.mark.parametrize(
    "url", ["s3://", "s3://Not A Bucket/x", "s3:/bucket/inbound", "ftp://host/mail", "S3://b/x"]
)
def test_a_malformed_store_url_is_an_error_naming_the_variable(settings, url):
    settings.INBOUND_EMAIL_STORE = url
    [error] = _errors("inbound_email.E001")
    assert "INBOUND_EMAIL_STORE" in error.msg


@pytest.mark.parametrize("url", ["s3://my-bucket/inbound/", "s3://my.bucket", "/srv/mail", "var/x"])
def test_a_store_url_or_folder_passes(settings, url):
    settings.INBOUND_EMAIL_STORE = url
    assert _errors("inbound_email.E001") == []


@pytest.mark.parametrize("token", ["not-a-token", "   ", "Bearer xoxb-1"])
def test_a_slack_token_that_is_no_token_is_an_error(settings, token):
    settings.SLACK_BOT_TOKEN = token
    [error] = _errors("inbound_email.E002")
    assert "SLACK_BOT_TOKEN" in error.msg


def test_slack_off_or_a_bot_token_passes(settings):
    settings.SLACK_BOT_TOKEN = ""
    assert _errors("inbound_email.E00") == []
    settings.SLACK_BOT_TOKEN = "xoxb-123-abc"
    assert _errors("inbound_email.E00") == []
