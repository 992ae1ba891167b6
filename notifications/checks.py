"""System checks of the app's configuration (`manage.py check`; manage.py runs them before the
worker starts and prints each error on one line): an SES sender with no region used to pass
start-up and fail at the first send. With `--deploy`: warn when notifications cannot carry a
one-click unsubscribe."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, Warning, register

from notifications.conf import SENDER_ALIASES, get_config


@register()
def check_ses_region(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    config = get_config()
    if config.email_sender_path != SENDER_ALIASES["ses"] or config.ses_region:
        return []
    import boto3

    if boto3.session.Session().region_name:  # AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config
        return []
    return [
        Error(
            "EMAIL_SENDER=ses has no AWS region",
            hint="set SES_REGION (or AWS_REGION / AWS_DEFAULT_REGION), e.g. SES_REGION=eu-west-1",
            id="notifications.E001",
        )
    ]


@register(Tags.security, deploy=True)
def public_base_url_check(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    url = get_config().public_base_url
    if not url:
        return [
            Warning(
                "PUBLIC_BASE_URL is not set: notifications carry a mailto List-Unsubscribe "
                "only, without the one-click link (RFC 8058) Gmail and Yahoo require of bulk "
                "senders.",
                hint="Set PUBLIC_BASE_URL to the https:// URL the web service answers at.",
                id="notifications.W001",
            )
        ]
    if not url.startswith("https://"):
        return [
            Warning(
                f"PUBLIC_BASE_URL={url!r} is not https: mailbox providers ignore a one-click "
                "unsubscribe link that is not https.",
                id="notifications.W002",
            )
        ]
    return []
