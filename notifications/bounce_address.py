"""The envelope sender of every notification (VERP): the proof a bounce or complaint report
must carry to count (issue 28.5).

Each notification leaves with its own envelope sender, `replies+bounce-<id>-<mac>@<reply
domain>` (INBOUND_REPLY_ADDRESS's mailbox, so reports reach the inbound poller by the same
route as replies), where <mac> is an HMAC of the notification's id under SECRET_KEY. A
receiving server that cannot deliver the mail sends its DSN there; SES sends the bounces and
complaints it forwards there too (the `Source` of SendRawEmail). The address is in no part of
the message itself: not the body, not a link, not Reply-To, not a header we write. So a
report addressed to it comes from a mail system that handled the mail, not from someone
holding a copy of it (a forward shows the reply token and the unsubscribe link, never this).

Through SES the recipient never sees it either (delivered mail carries SES's own
Return-Path). Through Django's SMTP backend it is the SMTP envelope sender, which the
recipient's server writes into the delivered copy's Return-Path header: a copy forwarded
*as an attachment* (every header) shows it. The window in which a report counts
(`BOUNCE_REPORT_DAYS` after the send) bounds what such a copy is good for.

Derived, not stored: nothing to migrate, nothing the other writers of the table must fill
in. SECRET_KEY_FALLBACKS are tried too, so a key rotation does not disown the bounces of
mail sent just before it.
"""

from __future__ import annotations

import hmac
import re
from datetime import timedelta

from django.utils.crypto import salted_hmac

from notifications.conf import get_config

_SALT = "notifications.bounce-address"
_MAC_CHARS = 24  # hex digits: 96 bits
_LOCAL = re.compile(r"^bounce-(?P<id>[1-9][0-9]{0,18})-(?P<mac>[0-9a-f]{24})$")
BOUNCE_REPORT_DAYS = timedelta(days=14)  # a report counts this long after the send


def _mac(notification_id: int, secret: str) -> str:
    return salted_hmac(_SALT, str(notification_id), secret=secret, algorithm="sha256").hexdigest()[
        :_MAC_CHARS
    ]


def bounce_address_for(notification_id: int) -> str:
    """The envelope sender of the notification `notification_id`."""
    config = get_config()
    local, _, domain = config.reply_address.partition("@")
    mac = _mac(notification_id, config.bounce_address_keys[0])
    return f"{local}+bounce-{notification_id}-{mac}@{domain}"


def notification_id_from_bounce_address(address: str) -> int | None:
    """The notification whose envelope sender `address` is; None for any other address
    (a reply address, a made-up id, a wrong or stale MAC)."""
    local, at, domain = address.strip().strip("<>").rpartition("@")
    base_local, _, base_domain = get_config().reply_address.partition("@")
    name, plus, tag = local.partition("+")
    if not (at and plus) or name.lower() != base_local.lower():
        return None
    if domain.lower() != base_domain.lower():
        return None
    match = _LOCAL.match(tag.lower())
    if match is None:
        return None
    notification_id = int(match["id"])
    for secret in get_config().bounce_address_keys:
        if hmac.compare_digest(_mac(notification_id, secret), match["mac"]):
            return notification_id
    return None
