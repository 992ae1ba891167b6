"""Writes of the canonical_ids app."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext

from django.db import IntegrityError, transaction

from canonical_ids import leases
from canonical_ids.exceptions import MessageConflict
from canonical_ids.minter import get_minter
from canonical_ids.models import Message

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


def _savepoint_if_in_transaction() -> AbstractContextManager:
    if transaction.get_connection().in_atomic_block:
        return transaction.atomic()
    return nullcontext()


def record_message(
    *, run_id: str, text: str, author: str, source: str, metadata: dict | None = None
) -> Message:
    """Store a message under a freshly minted ts; a (run_id, ts) conflict is never dropped.

    Inside a caller's transaction each insert runs in a savepoint (a conflict must not abort
    the caller's transaction); in autocommit the insert is its own transaction (no BEGIN /
    COMMIT round trips). The insert goes ahead only while the lease row still names this
    process: a lease that vanished (expired and taken over, or a test database flushed
    under a long-lived process) makes the minter claim again before it mints. A unique
    conflict on (run_id, ts) is retried with a fresh id up to MAX_ATTEMPTS, then raised.
    """
    minter = get_minter()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        ts, slot, token = minter.mint_with_lease()
        if not leases.lease_is_held(slot=slot, token=token):
            minter.invalidate(slot=slot, token=token)
            continue
        try:
            with _savepoint_if_in_transaction():
                return Message.objects.create(
                    run_id=run_id,
                    ts=ts,
                    author=author,
                    source=source,
                    text=text,
                    metadata=metadata or {},
                )
        except IntegrityError:
            if not Message.objects.filter(run_id=run_id, ts=ts).exists():
                raise
            logger.warning(
                "Message id %s already taken in run %s (attempt %s); minting a fresh one",
                ts,
                run_id,
                attempt,
                extra={"action": "message_ts_conflict", "run_id": run_id, "attempt": attempt},
            )
    raise MessageConflict(
        f"Could not store a message of run {run_id!r} after {MAX_ATTEMPTS} attempts: its minted "
        "ids kept colliding or the writer lease kept vanishing"
    )
