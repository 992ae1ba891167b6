"""Email addresses are redacted in logs, one way everywhere: `p***@example.org`.

Enough to tell mails and users apart when reading logs, not enough to harvest addresses.
The database rows keep the full detail for operators (the admin).
"""

from __future__ import annotations

import re

_EMAIL = re.compile(r"([\w.+-]+)@([\w-]+(?:\.[\w-]+)+)")


def redact_address(address: str) -> str:
    """j***@example.org for one address; *** when it is not an address at all."""
    local, at, domain = (address or "").partition("@")
    return f"{local[:1]}***{at}{domain}" if at else "***"


def redact_emails(text: str) -> str:
    """Every address inside free text (an error message naming a bounced recipient)."""
    return _EMAIL.sub(lambda match: redact_address(match.group(0)), text)
