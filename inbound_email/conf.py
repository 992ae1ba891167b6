"""The app's settings, read when needed (so tests can override them) and validated.

Every inbound_email module reads its settings through `get_config()`; none reads
`django.conf.settings` itself. project/settings.py parses the environment (and refuses
malformed values at start-up); this module checks what a settings override or another settings
module could still get wrong, and says which setting is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Config:
    store_url: str  # "s3://bucket/prefix" or a folder path
    quarantine_prefix: str  # S3 key prefix / sub-folder of quarantined mail
    s3_timeout: float  # seconds per S3 connect and per read, each try
    s3_read_deadline: float  # seconds one object's GetObject may take in all, body included
    max_per_run: int  # objects handled per poll run
    max_bytes: int  # larger mail is quarantined unread
    max_attempts: int  # handling attempts before quarantine
    retry_base_seconds: float  # backoff of transient failures
    retry_cap_seconds: float
    poll_interval: float  # seconds between passes of `poll_inbound_email` without --once
    max_replies_per_token_per_hour: int
    relay_max_attempts: int  # Slack posts before the database-inbox fallback
    relay_backoff_base_seconds: float
    relay_backoff_cap_seconds: float
    relay_claim_timeout_seconds: float  # a `posting` claim older than this lost its worker
    slack_bot_token: str  # empty: Slack off
    slack_api_url: str
    slack_timeout: float  # seconds per HTTP call
    check_ses_verdicts: bool  # reject / quarantine on SES's verdict headers (issue 10)
    # The receiving host's authserv-id: its topmost Authentication-Results is read ("": never)
    authserv_id: str
    # What one mail may cost the parser (see parse_limits.ParseLimits)
    max_mime_parts: int
    max_mime_depth: int
    max_headers: int
    max_header_bytes: int  # one header field, raw
    max_header_total_bytes: int  # all header fields together, raw
    max_text_bytes: int  # the text part used, transfer-decoded
    max_report_bytes: int  # body bytes of a bounce/complaint report the detectors read
    max_bounce_scan_bytes: int  # of those, what flufl.bounce's heuristics scan
    attachments_prefix: str  # S3 key prefix / sub-folder of stored attachments (issue 21)
    max_attachment_bytes: int  # one attachment, decoded; larger: kept in the raw mail only
    max_attachments: int  # stored per mail; the rest: kept in the raw mail only
    max_html_depth: int  # block elements nested at once in the HTML part
    # Retention (issue 21)
    kept_raw_bytes: int  # raw bytes a rejected mail keeps (the first ones; the rest dropped)
    retention_days: float  # finished rows older than this are pruned (quarantined ones never)

    @property
    def slack_enabled(self) -> bool:
        return bool(self.slack_bot_token)


def _int(name: str, default: int, *, minimum: int) -> int:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} must be an integer of at least {minimum}")
    return value


def _float(name: str, default: float, *, minimum: float, inclusive: bool = True) -> float:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImproperlyConfigured(f"{name}={value!r} must be a number")
    if value < minimum or (not inclusive and value == minimum):
        bound = "at least" if inclusive else "above"
        raise ImproperlyConfigured(f"{name}={value!r} must be {bound} {minimum}")
    return float(value)


def _str(name: str, default: str, *, required: bool) -> str:
    value = getattr(settings, name, default)
    if not isinstance(value, str) or (required and not value.strip()):
        raise ImproperlyConfigured(f"{name}={value!r} must be a non-empty string")
    return value


# InboundEmail.quarantine_key (1,100) holds the prefix plus a store key of up to 1,024.
QUARANTINE_PREFIX_MAX_CHARS = 1100 - 1024


def _quarantine_prefix() -> str:
    # An empty prefix would make the quarantine copy the intake object itself, which the
    # clean-up then deletes: the mail would be lost.
    value = _str("INBOUND_EMAIL_QUARANTINE_PREFIX", "quarantine/", required=True)
    if len(value) > QUARANTINE_PREFIX_MAX_CHARS:
        raise ImproperlyConfigured(
            f"INBOUND_EMAIL_QUARANTINE_PREFIX={value!r} must be at most "
            f"{QUARANTINE_PREFIX_MAX_CHARS} characters (quarantine keys are stored in 1,100)"
        )
    return value


def _attachments_prefix(quarantine_prefix: str) -> str:
    """A prefix of its own: empty, it would put attachments among the intake's mail; inside
    the quarantine prefix (or around it), the two would mix."""
    value = _str("INBOUND_EMAIL_ATTACHMENTS_PREFIX", "attachments/", required=True)
    if value.startswith(quarantine_prefix) or quarantine_prefix.startswith(value):
        raise ImproperlyConfigured(
            f"INBOUND_EMAIL_ATTACHMENTS_PREFIX={value!r} must not overlap "
            f"INBOUND_EMAIL_QUARANTINE_PREFIX={quarantine_prefix!r}"
        )
    return value


def _check_ses_verdicts(store_url: str) -> bool:
    """INBOUND_EMAIL_CHECK_SES_VERDICTS, or when unset (None): on for an S3 store, which SES
    fills and writes its verdicts into; off for a folder store, fed by hand or by tests, where
    a verdict header is whatever the file says."""
    value = getattr(settings, "INBOUND_EMAIL_CHECK_SES_VERDICTS", None)
    if value is None:
        return store_url.startswith("s3://")
    if not isinstance(value, bool):
        raise ImproperlyConfigured(
            f"INBOUND_EMAIL_CHECK_SES_VERDICTS={value!r} must be True, False or None (the default)"
        )
    return value


KEPT_RAW_BYTES_MAX = 64 * 1024  # issue 21: rejected junk keeps at most 64 KiB of raw


def _kept_raw_bytes() -> int:
    value = _int("INBOUND_EMAIL_REJECTED_RAW_BYTES", KEPT_RAW_BYTES_MAX, minimum=0)
    if value > KEPT_RAW_BYTES_MAX:
        raise ImproperlyConfigured(
            f"INBOUND_EMAIL_REJECTED_RAW_BYTES={value!r} must be at most {KEPT_RAW_BYTES_MAX}"
        )
    return value


def get_config() -> Config:
    """The validated settings; raises ImproperlyConfigured naming the first bad one."""
    store_url = _str("INBOUND_EMAIL_STORE", "var/inbound_mail", required=True)
    quarantine_prefix = _quarantine_prefix()
    return Config(
        store_url=store_url,
        quarantine_prefix=quarantine_prefix,
        s3_timeout=_float("INBOUND_EMAIL_S3_TIMEOUT", 20, minimum=0, inclusive=False),
        s3_read_deadline=_float("INBOUND_EMAIL_S3_READ_DEADLINE", 60, minimum=0, inclusive=False),
        max_per_run=_int("INBOUND_EMAIL_MAX_PER_RUN", 2000, minimum=1),
        max_bytes=_int("INBOUND_EMAIL_MAX_BYTES", 10 * 1024 * 1024, minimum=1),
        max_attempts=_int("INBOUND_EMAIL_MAX_ATTEMPTS", 5, minimum=1),
        retry_base_seconds=_float("INBOUND_EMAIL_RETRY_BASE_SECONDS", 30, minimum=0),
        retry_cap_seconds=_float("INBOUND_EMAIL_RETRY_CAP_SECONDS", 3600, minimum=0),
        poll_interval=_float("INBOUND_EMAIL_POLL_INTERVAL", 30, minimum=0, inclusive=False),
        max_replies_per_token_per_hour=_int("MAX_REPLIES_PER_TOKEN_PER_HOUR", 5, minimum=1),
        relay_max_attempts=_int("INBOUND_RELAY_MAX_ATTEMPTS", 6, minimum=1),
        relay_backoff_base_seconds=_float("INBOUND_RELAY_BACKOFF_BASE_SECONDS", 30, minimum=0),
        relay_backoff_cap_seconds=_float("INBOUND_RELAY_BACKOFF_CAP_SECONDS", 1800, minimum=0),
        relay_claim_timeout_seconds=_float("INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS", 300, minimum=0),
        slack_bot_token=_str("SLACK_BOT_TOKEN", "", required=False),
        slack_api_url=_str("SLACK_API_URL", "https://slack.com/api/", required=True),
        slack_timeout=_float("SLACK_TIMEOUT", 10, minimum=0, inclusive=False),
        check_ses_verdicts=_check_ses_verdicts(store_url),
        authserv_id=_str("INBOUND_EMAIL_AUTHSERV_ID", "amazonses.com", required=False).strip(),
        max_mime_parts=_int("INBOUND_EMAIL_MAX_MIME_PARTS", 100, minimum=1),
        max_mime_depth=_int("INBOUND_EMAIL_MAX_MIME_DEPTH", 20, minimum=1),
        max_headers=_int("INBOUND_EMAIL_MAX_HEADERS", 1000, minimum=1),
        max_header_bytes=_int("INBOUND_EMAIL_MAX_HEADER_BYTES", 16 * 1024, minimum=1),
        max_header_total_bytes=_int("INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES", 256 * 1024, minimum=1),
        max_text_bytes=_int("INBOUND_EMAIL_MAX_TEXT_BYTES", 1024 * 1024, minimum=1),
        max_report_bytes=_int("INBOUND_EMAIL_MAX_REPORT_BYTES", 32 * 1024, minimum=1),
        max_bounce_scan_bytes=_int("INBOUND_EMAIL_MAX_BOUNCE_SCAN_BYTES", 8 * 1024, minimum=1),
        attachments_prefix=_attachments_prefix(quarantine_prefix),
        max_attachment_bytes=_int("INBOUND_EMAIL_MAX_ATTACHMENT_BYTES", 8 * 1024 * 1024, minimum=1),
        max_attachments=_int("INBOUND_EMAIL_MAX_ATTACHMENTS", 20, minimum=1),
        max_html_depth=_int("INBOUND_EMAIL_MAX_HTML_DEPTH", 1000, minimum=1),
        kept_raw_bytes=_kept_raw_bytes(),
        retention_days=_float("INBOUND_RETENTION_DAYS", 30, minimum=0, inclusive=False),
    )
