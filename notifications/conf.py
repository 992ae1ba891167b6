"""The notifications app's settings, validated (each error naming the variable) and cached
until a setting changes (override_settings and pytest's settings fixture send
setting_changed). Every module of the app reads settings here.

project/settings.py parses the environment into Django settings; this module checks what the
app needs of those values (types, ranges, the sender) and is called once by the AppConfig, so
a bad value stops start-up instead of failing the first sweep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

# EMAIL_SENDER accepts these aliases, or the dotted path of any class with the sender
# interface (notifications.senders.base.EmailSender), as EMAIL_BACKEND does for Django.
SENDER_ALIASES = {
    "django": "notifications.senders.django.DjangoEmailSender",
    "ses": "notifications.senders.ses.SesEmailSender",
}
_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


@dataclass(frozen=True)
class Config:
    email_sender: str  # the setting as given (an alias or a dotted path)
    email_sender_path: str  # the dotted path of the sender class
    default_from_email: str  # From: of every notification
    reply_address: str  # INBOUND_REPLY_ADDRESS; tokens go in local+TOKEN@domain
    ses_region: str  # empty: boto3's own region chain
    ses_configuration_set: str  # empty: none
    review_expiry_hours: int
    reply_window_hours: int
    send_max_attempts: int
    retry_base_seconds: int
    retry_max_seconds: int
    claim_timeout_seconds: int
    sweep_batch_size: int  # users per batch
    sweep_lease_seconds: float  # a sweep's lease; its holder renews it every quarter of it
    send_rate: float  # mails per second for all processes; 0: SES's MaxSendRate
    send_quota_refresh_seconds: int  # how long GetSendQuota's answer is trusted
    send_pause_seconds: int  # a daily-quota pause lasts this long before SES is asked again
    throttle_retry_seconds: float  # wait after a rate refusal before the next try
    ses_events_topic_arns: tuple[str, ...]  # SNS topics /ses/events believes; empty: off
    ses_events_trusted_cert_urls: tuple[str, ...]  # tests only: a local signing certificate
    ses_events_trusted_subscribe_urls: tuple[str, ...]  # tests only: a local SubscribeURL
    ses_events_max_body_bytes: int  # a bigger POST to /ses/events is refused unread
    ses_events_fetch_deadline_seconds: float  # a certificate or SubscribeURL fetch, in all
    ses_events_cert_failure_cache_seconds: float  # a failed certificate URL answers 503 this long
    ses_events_cert_fetches_per_minute: int  # fetches of uncached certificate URLs, per process
    public_base_url: str  # https://host of /unsubscribe/<token>; empty: mailto unsubscribe only
    # The bounce address's MAC keys: SECRET_KEY, then SECRET_KEY_FALLBACKS (a key rotation
    # keeps the bounces of mail sent under the old key). Never shown in a repr.
    bounce_address_keys: tuple[str, ...] = field(default=(), repr=False)


def _int(name: str, default: int, *, minimum: int) -> int:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ImproperlyConfigured(f"{name}={value!r} must be an integer")
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} must be at least {minimum}")
    return value


def _float(name: str, default: float, *, minimum: float) -> float:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImproperlyConfigured(f"{name}={value!r} must be a number")
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} must be at least {minimum}")
    return float(value)


def _str(name: str, default: str) -> str:
    value: Any = getattr(settings, name, default)
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{name}={value!r} must be a string")
    return value


def _strings(name: str) -> tuple[str, ...]:
    value: Any = getattr(settings, name, ())
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise ImproperlyConfigured(f"{name}={value!r} must be a list of strings")
    return tuple(item.strip() for item in value if item.strip())


def _public_base_url() -> str:
    value = _str("PUBLIC_BASE_URL", "").strip().rstrip("/")
    if value and not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", value):
        raise ImproperlyConfigured(
            f"PUBLIC_BASE_URL={value!r} must be the site's base URL, like https://assistant.example.org"
        )
    return value


def sender_path(value: str) -> str:
    """EMAIL_SENDER -> the dotted path of the sender class (aliases are case-insensitive)."""
    alias = SENDER_ALIASES.get(value.strip().lower())
    if alias:
        return alias
    if _DOTTED_PATH.match(value.strip()):
        return value.strip()
    raise ImproperlyConfigured(
        f"EMAIL_SENDER={value!r} is not a sender: use {' or '.join(map(repr, SENDER_ALIASES))}, "
        "or the dotted path of a sender class (e.g. 'notifications.senders.ses.SesEmailSender')"
    )


def _reply_address() -> str:
    value = _str("INBOUND_REPLY_ADDRESS", "replies@reply.localhost")
    local, at, domain = value.partition("@")
    if not (at and local and domain) or "+" in local or "@" in domain:
        raise ImproperlyConfigured(
            f"INBOUND_REPLY_ADDRESS={value!r} must be one address like replies@reply.example.org "
            "(no '+': the token is added as replies+TOKEN@…)"
        )
    return value


@cache  # cleared whenever a setting changes (override_settings, pytest's settings fixture)
def get_config() -> Config:
    sender = _str("EMAIL_SENDER", "django")
    retry_base = _int("NOTIFICATION_RETRY_BASE_SECONDS", 60, minimum=0)
    retry_max = _int("NOTIFICATION_RETRY_MAX_SECONDS", 3600, minimum=0)
    if retry_max < retry_base:
        raise ImproperlyConfigured(
            f"NOTIFICATION_RETRY_MAX_SECONDS={retry_max} must be at least "
            f"NOTIFICATION_RETRY_BASE_SECONDS={retry_base}"
        )
    return Config(
        email_sender=sender,
        email_sender_path=sender_path(sender),
        default_from_email=_str("DEFAULT_FROM_EMAIL", "webmaster@localhost"),
        reply_address=_reply_address(),
        ses_region=_str("SES_REGION", ""),
        ses_configuration_set=_str("SES_CONFIGURATION_SET", ""),
        review_expiry_hours=_int("NOTIFICATION_REVIEW_EXPIRY_HOURS", 72, minimum=1),
        reply_window_hours=_int("NOTIFICATION_REPLY_WINDOW_HOURS", 168, minimum=1),
        send_max_attempts=_int("NOTIFICATION_SEND_MAX_ATTEMPTS", 5, minimum=1),
        retry_base_seconds=retry_base,
        retry_max_seconds=retry_max,
        # 0 is allowed here (tests: every claim over budget); the environment asks for >= 60.
        claim_timeout_seconds=_int("NOTIFICATION_CLAIM_TIMEOUT_SECONDS", 900, minimum=0),
        sweep_batch_size=_int("NOTIFICATION_SWEEP_BATCH_SIZE", 500, minimum=1),
        sweep_lease_seconds=_float("NOTIFICATION_SWEEP_LEASE_SECONDS", 30, minimum=1),
        send_rate=_float("NOTIFICATION_SEND_RATE", 0, minimum=0),
        send_quota_refresh_seconds=_int("NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS", 600, minimum=0),
        send_pause_seconds=_int("NOTIFICATION_SEND_PAUSE_SECONDS", 900, minimum=0),
        throttle_retry_seconds=_float("NOTIFICATION_THROTTLE_RETRY_SECONDS", 1, minimum=0),
        ses_events_topic_arns=_strings("SES_EVENTS_TOPIC_ARNS"),
        ses_events_trusted_cert_urls=_strings("SES_EVENTS_TRUSTED_CERT_URLS"),
        ses_events_trusted_subscribe_urls=_strings("SES_EVENTS_TRUSTED_SUBSCRIBE_URLS"),
        ses_events_max_body_bytes=_int("SES_EVENTS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024),
        ses_events_fetch_deadline_seconds=_float(
            "SES_EVENTS_FETCH_DEADLINE_SECONDS", 5, minimum=0.1
        ),
        ses_events_cert_failure_cache_seconds=_float(
            "SES_EVENTS_CERT_FAILURE_CACHE_SECONDS", 60, minimum=0
        ),
        ses_events_cert_fetches_per_minute=_int(
            "SES_EVENTS_CERT_FETCHES_PER_MINUTE", 10, minimum=1
        ),
        public_base_url=_public_base_url(),
        bounce_address_keys=(
            settings.SECRET_KEY,
            *getattr(settings, "SECRET_KEY_FALLBACKS", ()),
        ),
    )


@receiver(setting_changed)
def _forget_config(**kwargs: Any) -> None:
    get_config.cache_clear()
