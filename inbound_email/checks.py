"""System checks of the app's configuration (`manage.py check`; manage.py runs them before the
worker starts and prints each error on one line). What the settings parser cannot see: a
store URL that is no store, and a Slack token that cannot be one.

The Slack channel is not configuration: the relay posts to the channel of the reply's
proposal (`Proposal.slack_channel`, written by the web app), so a proposal without one is a
per-reply refusal (retried, then the database inbox with `needs_operator`), not a start-up
error."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from inbound_email.conf import get_config
from inbound_email.exceptions import InvalidStoreUrl
from inbound_email.stores import parse_store_url

SLACK_TOKEN_PREFIXES = ("xoxb-", "xoxp-", "xoxe.", "xoxa-")  # bot, user, rotating, app tokens


@register()
def check_store_url(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    try:
        parse_store_url(get_config().store_url)
    except InvalidStoreUrl as exc:
        return [Error(str(exc), hint="e.g. s3://my-bucket/inbound/", id="inbound_email.E001")]
    return []


@register()
def check_slack(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    config = get_config()
    token = config.slack_bot_token
    errors = []
    if token and not token.strip().startswith(SLACK_TOKEN_PREFIXES):
        errors.append(
            Error(
                "SLACK_BOT_TOKEN is set but is not a Slack token (xoxb-...)",
                hint="set the Slack app's bot token, or leave SLACK_BOT_TOKEN empty for Slack off"
                " (instructions then go to the database inbox)",
                id="inbound_email.E002",
            )
        )
    if token and not config.slack_api_url.startswith(("https://", "http://")):
        errors.append(
            Error(
                f"SLACK_API_URL={config.slack_api_url!r} is not an http(s) URL",
                hint="leave it unset for https://slack.com/api/",
                id="inbound_email.E003",
            )
        )
    return errors
