"""What the relay needs of Slack without slack-sdk: whether Slack is on, and mrkdwn escaping.

Kept apart from `inbound_email.slack` so that importing the relay's services (every
`manage.py` command and qcluster does, through the admin and the job handlers) does not import
slack-sdk, about 50 ms of CPU per process start; the SDK is imported when a post is made.
"""

from __future__ import annotations

from inbound_email.conf import get_config


def slack_enabled() -> bool:
    return get_config().slack_enabled


def escape_mrkdwn(text: str) -> str:
    """Slack's three control characters; everything else is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
