"""Is a user's address fit to be a recipient? Checked when a notification is claimed.

`user.email` is written by the web app and the admin, not by us: it may hold a CR/LF (header
injection, and Django's BadHeaderError), several addresses, or no address at all. Such a row
fails at once with reason invalid_address instead of being claimed and sent (issue 10).
"""

from __future__ import annotations

from email.utils import getaddresses

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

MAX_ADDRESS_CHARS = 254  # RFC 5321 path limit, and EmailNotification.to_address's length


def address_problem(address: str) -> str | None:
    """Why `address` cannot be a recipient ("contains a line break", "several addresses",
    "invalid syntax", ...), or None when it can. Django's own validator decides the syntax."""
    if not address or not address.strip():
        return "no address"
    if "\r" in address or "\n" in address:
        return "contains a line break"
    if any(ord(char) < 32 or ord(char) == 127 for char in address):
        return "contains a control character"
    if len(address) > MAX_ADDRESS_CHARS:
        return f"longer than {MAX_ADDRESS_CHARS} characters"
    if "," in address or ";" in address or len(getaddresses([address])) > 1:
        return "several addresses"
    try:
        validate_email(address)
    except ValidationError:
        return "invalid syntax"
    return None
