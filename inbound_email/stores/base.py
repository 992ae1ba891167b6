"""What every mail store is: the interface, the listed object, and the key rules.

The poller only lists, reads, moves to quarantine and deletes; it never knows which store it
talks to. Listing skips SES's setup-notification object, folder placeholder keys and the
quarantine prefix, and gives every key in a form the ledger can hold (`safe_key`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from project.pg_text import without_nul

SES_SETUP_KEY = "AMAZON_SES_SETUP_NOTIFICATION"


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


class MailStore(Protocol):
    description: str

    def list(self) -> Iterator[list[StoredObject]]:
        """Pages of intake objects (at most 1,000 per page), in key order."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def quarantine(self, key: str) -> str:
        """Copy the object to the quarantine prefix and return its quarantine key."""

    def get_quarantined(self, quarantine_key: str) -> bytes: ...

    def delete(self, key: str) -> None:
        """Delete an intake (or quarantine) object; deleting a missing object is not an error."""

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        """Delete several objects; return {key: error} for those that failed."""

    def exists(self, key: str) -> bool: ...


# The longest key the ledger holds (InboundEmail.store_key's max_length): a longer one made
# the page's INSERT fail and with it every poll.
KEY_MAX_CHARS = 1024
_DIGEST_CHARS = 16


def safe_key(key: str) -> str:
    """`key` as text the ledger can hold: PostgreSQL takes no NUL and no lone surrogate, and
    store_key no more than KEY_MAX_CHARS.

    A file name that is not UTF-8 reaches Python with each odd byte as a lone surrogate
    (os.walk's surrogateescape); here those bytes, and any NUL, become backslash escapes
    (a Latin-1 "café.eml" becomes the key `caf\\xe9.eml`). A key still too long keeps its
    beginning and ends in "~" and a digest of the whole, so two long keys stay apart. Any
    other key is unchanged.
    """
    try:
        data = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an escaped byte
        data = key.encode("utf-8", "backslashreplace")
    text = without_nul(data.decode("utf-8", "backslashreplace"))
    if len(text) > KEY_MAX_CHARS:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
        text = text[: KEY_MAX_CHARS - _DIGEST_CHARS - 1].rstrip("/") + "~" + digest
    return text


def skip_key(key: str, quarantine_prefix: str, attachments_prefix: str = "") -> bool:
    """Not intake mail: a folder placeholder, SES's setup object, a dot-file, a quarantined
    mail or a stored attachment."""
    name = PurePosixPath(key).name
    return (
        key.endswith("/")
        or name == SES_SETUP_KEY
        or name.startswith(".")
        or (bool(quarantine_prefix) and key.startswith(quarantine_prefix))
        or (bool(attachments_prefix) and key.startswith(attachments_prefix))
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
