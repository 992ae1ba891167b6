"""The reply address carries the notification's token by plus-addressing.

Outgoing mail sets Reply-To: replies+TOKEN@domain (INBOUND_REPLY_ADDRESS, read through
notifications.conf); the inbound poller reads the token back from the To/Delivered-To
address. Both sides use these two functions so the format lives in one place.
"""

from __future__ import annotations

import re

from notifications.conf import get_config

_TOKEN_RE = re.compile(r"^[0-9a-f]{16,64}$")


def reply_address_for(token: str) -> str:
    local, _, domain = get_config().reply_address.partition("@")
    return f"{local}+{token}@{domain}"


def token_from_address(address: str) -> str | None:
    """Return the token of a reply address, or None if the address carries none."""
    local, sep, domain = address.strip().strip("<>").rpartition("@")
    if not sep:
        return None
    base_local, _, base_domain = get_config().reply_address.partition("@")
    name, plus, token = local.partition("+")
    if not plus or name.lower() != base_local.lower() or domain.lower() != base_domain.lower():
        return None
    token = token.lower()
    return token if _TOKEN_RE.match(token) else None
