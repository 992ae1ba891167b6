"""notifications.conf: every setting the app reads, each malformed one named in the error."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from notifications.conf import get_config


def test_default_settings_are_valid():
    config = get_config()
    assert config.email_sender_path == "notifications.senders.django.DjangoEmailSender"
    assert config.reply_address == "replies@reply.localhost"
    assert (config.review_expiry_hours, config.send_max_attempts) == (72, 5)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NOTIFICATION_SEND_MAX_ATTEMPTS", "5", "='5' must be an integer"),
        ("NOTIFICATION_SEND_MAX_ATTEMPTS", 0, "=0 must be at least 1"),
        ("NOTIFICATION_REVIEW_EXPIRY_HOURS", 0, "=0 must be at least 1"),
        ("NOTIFICATION_REPLY_WINDOW_HOURS", True, "NOTIFICATION_REPLY_WINDOW_HOURS=True must be"),
        ("NOTIFICATION_CLAIM_TIMEOUT_SECONDS", -1, "NOTIFICATION_CLAIM_TIMEOUT_SECONDS=-1"),
        ("NOTIFICATION_SWEEP_BATCH_SIZE", 0, "NOTIFICATION_SWEEP_BATCH_SIZE=0"),
        ("NOTIFICATION_RETRY_MAX_SECONDS", 10, "=10 must be at least NOTIFICATION_RETRY_BASE"),
        ("INBOUND_REPLY_ADDRESS", "replies", "INBOUND_REPLY_ADDRESS='replies'"),
        ("INBOUND_REPLY_ADDRESS", "r+x@reply.example.org", "INBOUND_REPLY_ADDRESS="),
        ("DEFAULT_FROM_EMAIL", None, "DEFAULT_FROM_EMAIL=None must be a string"),
        ("SES_REGION", 1, "SES_REGION=1 must be a string"),
        ("EMAIL_SENDER", "smtp", "EMAIL_SENDER='smtp'"),
        ("NOTIFICATION_SEND_RATE", -1, "NOTIFICATION_SEND_RATE=-1 must be at least 0"),
        ("NOTIFICATION_SEND_RATE", "fast", "NOTIFICATION_SEND_RATE='fast' must be a number"),
        ("NOTIFICATION_SEND_PAUSE_SECONDS", -5, "NOTIFICATION_SEND_PAUSE_SECONDS=-5"),
        ("PUBLIC_BASE_URL", "assistant.example.org", "PUBLIC_BASE_URL='assistant.example.org'"),
        ("SES_EVENTS_TOPIC_ARNS", "arn:aws:sns:x", "SES_EVENTS_TOPIC_ARNS='arn:aws:sns:x' must be"),
    ],
)
def test_a_malformed_setting_names_the_variable(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message) as error:
        get_config()
    assert str(error.value).startswith(f"{name}=")
