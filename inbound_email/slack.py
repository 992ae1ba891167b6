"""The Slack edge: post one message with slack-sdk, turn every failure into SlackPostError.

Text from mail is escaped (&, <, >) so `<!channel>`, `<!here>` or `<@U123>` in a reply is
shown literally and pings nobody; `parse="none"` and `link_names=False` keep Slack from
linking names on its own.
"""

from __future__ import annotations

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from inbound_email.conf import get_config
from inbound_email.exceptions import SlackPostError


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
            try:
                retry_after = float(header) if header is not None else 1.0
            except (TypeError, ValueError):
                retry_after = 1.0
        error = resp.get("error") if resp is not None else None
        raise SlackPostError(
            f"Slack chat.postMessage failed: {error or exc}", retry_after=retry_after
        ) from exc
    except (SlackClientError, OSError, ValueError) as exc:
        raise SlackPostError(f"Slack chat.postMessage failed: {exc}") from exc
    return str(response.get("ts") or "")
