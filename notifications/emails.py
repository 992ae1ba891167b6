"""Rendering notification mail from Django templates (plain text + HTML).

Everything a template needs travels in the Delivery built by the sweep from rows it already
loaded, so rendering costs no query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

from django.template.loader import render_to_string

from notifications.bounce_address import bounce_address_for
from notifications.conf import get_config
from notifications.reply_address import reply_address_for
from notifications.senders.base import OutgoingEmail
from notifications.unsubscribe import unsubscribe_url


@dataclass(frozen=True)
class Delivery:
    """One claimed row on its way to the mail service."""

    notification_id: int
    kind: str
    token: str
    to_address: str
    user_id: int
    recipient_name: str
    claimed_at: datetime
    attempt: int
    proposal_title: str = ""
    digest_titles: tuple[str, ...] = ()
    notice_reason: str = ""  # reply_rejected: why the PI's reply was not acted on


def unsubscribe_header(token: str, *, notification_id: int) -> str:
    """RFC 2369 List-Unsubscribe: the one-click https link of the notification first (RFC
    8058, when PUBLIC_BASE_URL is set), then a mail to the reply address (`token`'s) with
    subject "unsubscribe"."""
    mailto = f"<mailto:{reply_address_for(token)}?subject={quote('unsubscribe')}>"
    url = unsubscribe_url(notification_id)
    return f"<{url}>, {mailto}" if url else mailto


def unsubscribe_headers(token: str, *, notification_id: int) -> dict[str, str]:
    """List-Unsubscribe, and List-Unsubscribe-Post when there is a link to POST to (RFC 8058:
    Gmail and Yahoo show their unsubscribe button for bulk senders only with both)."""
    headers = {"List-Unsubscribe": unsubscribe_header(token, notification_id=notification_id)}
    if unsubscribe_url(notification_id):
        headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    return headers


def render_notification_email(delivery: Delivery, *, expires_at: datetime) -> OutgoingEmail:
    context = {
        "name": delivery.recipient_name,
        "proposal_title": delivery.proposal_title,
        "digest_titles": delivery.digest_titles,
        "expires_at": expires_at,
        "reply_address": reply_address_for(delivery.token),
        "reason": delivery.notice_reason,
    }
    base = f"notifications/email/{delivery.kind}"
    subject = " ".join(render_to_string(f"{base}_subject.txt", context).split())
    return OutgoingEmail(
        to=delivery.to_address,
        subject=subject,
        text=render_to_string(f"{base}.txt", context),
        html=render_to_string(f"{base}.html", context),
        reply_to=reply_address_for(delivery.token),
        from_email=get_config().default_from_email,
        envelope_from=bounce_address_for(delivery.notification_id),
        headers={
            **unsubscribe_headers(delivery.token, notification_id=delivery.notification_id),
            "Auto-Submitted": "auto-generated",
            "X-Notification-Kind": delivery.kind,
        },
    )
