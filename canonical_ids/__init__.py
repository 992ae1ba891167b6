"""Canonical message ids ("SSSSSSSSSS.uuuuuu") that never collide across processes.

Public interface (other code and the other processes rely on it):
    from canonical_ids import mint_ts, record_message
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from canonical_ids.models import Message


# Each function imports its implementation when called: minter and services import the
# models, and this package is imported while INSTALLED_APPS loads, before models may be.
def mint_ts() -> str:
    """Mint the next id of this process's writer slot (raises if no slot is held)."""
    from canonical_ids.minter import mint_ts as _mint_ts

    return _mint_ts()


def record_message(*, run_id: str, text: str, author: str, source: str, **extra: Any) -> Message:
    """Insert a Message with a freshly minted ts; a ts conflict is never silently dropped."""
    from canonical_ids.services import record_message as _record_message

    return _record_message(run_id=run_id, text=text, author=author, source=source, **extra)


__all__ = ["mint_ts", "record_message"]
