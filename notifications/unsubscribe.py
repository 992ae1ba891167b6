"""One-click unsubscribe (RFC 8058, issue 23.3): the link every notification carries in
List-Unsubscribe when PUBLIC_BASE_URL is set, and what it does.

The link names the notification by its id, signed with SECRET_KEY (Django's `Signer`, its
own salt): `/unsubscribe/n<id>:<signature>`. It never expires (an old mail's link still
works, as RFC 8058 expects), cannot be forged or guessed from another, and shows nothing
else: not the reply token, not the bounce address (issue 28.5). An operator revokes one by
adding an UnsubscribeRevocation in the admin. Unsubscribing is
`services.notification_unsubscribe`, the same as the mailto unsubscribe: the PI's
notifications pause (restorable in the admin).

Links mailed before issue 28 have the older form `/unsubscribe/<reply token>:<signature>`
(the reply token signed under the salt `notifications.unsubscribe`). They keep working, so a
PI's old mail still unsubscribes, and a revocation stops them as it stops the new form. What
they show, the reply token, is also in the mail's Reply-To and proves nothing about bounces
any more (bounce_address.py); a later release may drop the old form (expand, then contract).
"""

from __future__ import annotations

import re

from django.core import signing
from django.core.exceptions import ObjectDoesNotExist

from notifications.conf import get_config
from notifications.models import EmailNotification, NotificationPreference
from notifications.services import notification_unsubscribe

_SALT = "notifications.unsubscribe-link"
_OLD_SALT = "notifications.unsubscribe"  # links mailed before issue 28: the reply token
_ID = re.compile(r"^n([1-9][0-9]{0,18})$")


class InvalidLink(Exception):
    """Not a link we made, or one that was revoked."""


def unsubscribe_token(notification_id: int) -> str:
    """The link's signed token for a notification (URL-safe)."""
    return signing.Signer(salt=_SALT).sign(f"n{notification_id}")


def unsubscribe_url(notification_id: int) -> str | None:
    """The one-click link of a notification; None without PUBLIC_BASE_URL."""
    base = get_config().public_base_url
    return f"{base}/unsubscribe/{unsubscribe_token(notification_id)}" if base else None


def notification_for_link(signed: str) -> EmailNotification:
    """The notification a link names; InvalidLink when forged, unknown or revoked."""
    rows = EmailNotification.objects.select_related("user")
    try:
        match = _ID.match(signing.Signer(salt=_SALT).unsign(signed))
        if match is None:
            raise InvalidLink("not a valid unsubscribe link")
        lookup = rows.filter(pk=int(match[1]))
    except signing.BadSignature:
        try:
            lookup = rows.filter(token=signing.Signer(salt=_OLD_SALT).unsign(signed))
        except signing.BadSignature as exc:
            raise InvalidLink("not a valid unsubscribe link") from exc
    try:
        notification = lookup.get()
    except ObjectDoesNotExist as exc:
        raise InvalidLink("no such notification") from exc
    if hasattr(notification, "unsubscribe_revocation"):
        raise InvalidLink("this unsubscribe link was revoked")
    return notification


def unsubscribe_by_link(signed: str) -> NotificationPreference:
    """Pause the PI's mail (idempotent). InvalidLink for a link that does not stand."""
    notification = notification_for_link(signed)
    return notification_unsubscribe(token=notification.token, reason="unsubscribed by link")
