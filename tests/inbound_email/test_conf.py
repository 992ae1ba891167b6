"""inbound_email's settings are read and validated in one place (`inbound_email/conf.py`)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from inbound_email.conf import get_config
from inbound_email.stores import store_from_url


def test_settings_are_read_when_needed_so_overrides_apply(settings, tmp_path):
    settings.INBOUND_EMAIL_MAX_ATTEMPTS = 7
    settings.SLACK_BOT_TOKEN = "xoxb-1"
    config = get_config()
    assert config.max_attempts == 7
    assert config.slack_enabled


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("INBOUND_EMAIL_MAX_ATTEMPTS", 0, "INBOUND_EMAIL_MAX_ATTEMPTS=0 must be an integer"),
        ("INBOUND_EMAIL_MAX_PER_RUN", "10", "INBOUND_EMAIL_MAX_PER_RUN='10' must be an integer"),
        ("MAX_REPLIES_PER_TOKEN_PER_HOUR", True, "MAX_REPLIES_PER_TOKEN_PER_HOUR=True"),
        ("INBOUND_RELAY_BACKOFF_BASE_SECONDS", -1, "must be at least 0"),
        ("SLACK_TIMEOUT", 0, "SLACK_TIMEOUT=0 must be above 0"),
        ("INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS", -1, "must be at least 0"),
        ("INBOUND_EMAIL_STORE", " ", "INBOUND_EMAIL_STORE=' ' must be a non-empty string"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()


def test_an_empty_quarantine_prefix_is_refused_before_any_mail_could_be_lost(settings):
    """With no prefix the quarantine copy would be the intake object itself, then deleted."""
    settings.INBOUND_EMAIL_QUARANTINE_PREFIX = ""
    with pytest.raises(ImproperlyConfigured, match="INBOUND_EMAIL_QUARANTINE_PREFIX"):
        store_from_url()


@pytest.mark.parametrize(
    ("store", "value", "expected"),
    [
        ("s3://bucket/inbound", None, True),
        ("/var/mail/inbound", None, False),
        ("s3://bucket/inbound", False, False),
        ("/var/mail/inbound", True, True),
    ],
)
def test_the_ses_verdict_check_defaults_on_for_s3_only(settings, store, value, expected):
    settings.INBOUND_EMAIL_STORE = store
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = value
    assert get_config().check_ses_verdicts is expected


def test_a_ses_verdict_check_that_is_not_a_boolean_is_refused(settings):
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = "false"
    with pytest.raises(ImproperlyConfigured, match="INBOUND_EMAIL_CHECK_SES_VERDICTS='false'"):
        get_config()


def test_a_quarantine_prefix_too_long_for_the_ledger_is_refused(settings):
    """quarantine_key holds the prefix plus a key of up to 1,024 characters in 1,100: a longer
    prefix would make the quarantine of a long key fail to record, after the copy."""
    settings.INBOUND_EMAIL_QUARANTINE_PREFIX = "q" * 76 + "/"
    with pytest.raises(ImproperlyConfigured, match="at most 76 characters"):
        get_config()
    settings.INBOUND_EMAIL_QUARANTINE_PREFIX = "q" * 75 + "/"
    assert get_config().quarantine_prefix == "q" * 75 + "/"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("INBOUND_EMAIL_ATTACHMENTS_PREFIX", "", "INBOUND_EMAIL_ATTACHMENTS_PREFIX='' must be"),
        ("INBOUND_EMAIL_ATTACHMENTS_PREFIX", "quarantine/att/", "must not overlap"),
        ("INBOUND_EMAIL_ATTACHMENTS_PREFIX", "q", "must not overlap"),
        ("INBOUND_EMAIL_MAX_ATTACHMENT_BYTES", 0, "INBOUND_EMAIL_MAX_ATTACHMENT_BYTES=0"),
        ("INBOUND_EMAIL_MAX_ATTACHMENTS", "3", "INBOUND_EMAIL_MAX_ATTACHMENTS='3'"),
    ],
)
def test_a_bad_attachment_setting_is_refused_naming_it(settings, name, value, message):
    """Issue 21.1: an empty attachments prefix would store attachments among the intake's
    mail; one inside the quarantine prefix would mix the two."""
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()
