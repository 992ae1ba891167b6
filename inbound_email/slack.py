"""The Slack edge: post one message with slack-sdk, turn every failure into SlackPostError.

Text from mail is escaped (&, <, >) so `<!channel>`, `<!here>` or `<@U123>` in a reply is
shown literally and pings nobody; `parse="none"` and `link_names=False` keep Slack from
linking names on its own.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from inbound_email.conf import get_config
from inbound_email.exceptions import SlackPostError

RETRY_AFTER_DEFAULT_SECONDS = 1.0  # a 429 with no usable Retry-After
RETRY_AFTER_MAX_SECONDS = 3600.0  # "inf", "1e300": a wait past this is taken as this


def retry_after_seconds(value: object) -> float:
    """Slack's Retry-After as a finite number of seconds within [0, RETRY_AFTER_MAX_SECONDS].

    The header is input from the network: "inf" or "1e300" used to reach `timedelta` and raise
    OverflowError in the relay. Seconds or an HTTP date are understood; a huge value is capped,
    a negative one is 0, and NaN or garbage is the default.
    """
    text = str(value).strip() if value is not None else ""
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return RETRY_AFTER_DEFAULT_SECONDS
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if math.isnan(seconds):
        return RETRY_AFTER_DEFAULT_SECONDS
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_SECONDS)


def slack_enabled() -> bool:
    return get_config().slack_enabled


def escape_mrkdwn(text: str) -> str:
    """Slack's three control characters; everything else is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _client() -> WebClient:
    config = get_config()
    return WebClient(
        token=config.slack_bot_token,
        base_url=config.slack_api_url,
        timeout=int(max(1, config.slack_timeout)),
    )


def post_message(*, channel: str, text: str) -> str:
    """Post `text` (already escaped) to `channel`; return the message ts."""
    if not slack_enabled():
        raise SlackPostError("Slack is off (no SLACK_BOT_TOKEN)")
    if not channel:
        raise SlackPostError("the proposal has no Slack channel")
    try:
        response = _client().chat_postMessage(
            channel=channel,
            text=text,
            parse="none",
            link_names=False,
            unfurl_links=False,
            unfurl_media=False,
        )
    except SlackApiError as exc:
        resp = exc.response
        retry_after = None
        if resp is not None and resp.status_code == 429:
            header = (resp.headers or {}).get("Retry-After") or (resp.headers or {}).get(
                "retry-after"
            )
            retry_after = retry_after_seconds(header)
        error = resp.get("error") if resp is not None else None
        raise SlackPostError(
            f"Slack chat.postMessage failed: {error or exc}", retry_after=retry_after
        ) from exc
    except (SlackClientError, OSError, ValueError) as exc:
        raise SlackPostError(f"Slack chat.postMessage failed: {exc}") from exc
    return str(response.get("ts") or "")
