"""`manage.py check --deploy`: warn when notifications cannot carry a one-click unsubscribe."""

from __future__ import annotations

from typing import Any

from django.core.checks import Tags, Warning, register

from notifications.conf import get_config


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
