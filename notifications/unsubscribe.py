"""One-click unsubscribe (RFC 8058, issue 23.3): the link every notification carries in
List-Unsubscribe when PUBLIC_BASE_URL is set, and what it does.

The link's token is the notification's reply token signed with SECRET_KEY (Django's
`Signer`, its own salt): it never expires (an old mail's link still works, as RFC 8058
expects) and cannot be forged or guessed from another; an operator revokes one by adding an
UnsubscribeRevocation in the admin. Unsubscribing is `services.notification_unsubscribe`, the
same as the mailto unsubscribe: the PI's notifications pause (restorable in the admin).
"""

from __future__ import annotations

from django.core import signing
from django.core.exceptions import ObjectDoesNotExist

from notifications.conf import get_config
from notifications.models import EmailNotification, NotificationPreference
from notifications.services import notification_unsubscribe

_SALT = "notifications.unsubscribe"


class InvalidLink(Exception):
    """Not a link we made, or one that was revoked."""


def unsubscribe_token(token: str) -> str:
    """The signed form of a notification's reply token (URL-safe)."""
    return signing.Signer(salt=_SALT).sign(token)


def unsubscribe_url(token: str) -> str | None:
    """The one-click link for a notification's token; None without PUBLIC_BASE_URL."""
    base = get_config().public_base_url
    return f"{base}/unsubscribe/{unsubscribe_token(token)}" if base else None


def notification_for_link(signed: str) -> EmailNotification:
    """The notification a link names; InvalidLink when forged, unknown or revoked."""
    try:
        token = signing.Signer(salt=_SALT).unsign(signed)
    except signing.BadSignature as exc:
        raise InvalidLink("not a valid unsubscribe link") from exc
    try:
        notification = EmailNotification.objects.select_related("user").get(token=token)
    except ObjectDoesNotExist as exc:
        raise InvalidLink("no such notification") from exc
    if hasattr(notification, "unsubscribe_revocation"):
        raise InvalidLink("this unsubscribe link was revoked")
    return notification


def unsubscribe_by_link(signed: str) -> NotificationPreference:
    """Pause the PI's mail (idempotent). InvalidLink for a link that does not stand."""
    notification = notification_for_link(signed)
    return notification_unsubscribe(token=notification.token, reason="unsubscribed by link")
