"""Errors of the canonical_ids app."""

from __future__ import annotations


class CanonicalIdError(Exception):
    """Base class of the app's errors."""


class NoWriterSlot(CanonicalIdError):
    """This process holds no writer slot, so it must not mint (never fall back to slot 1)."""


class SlotUnavailable(NoWriterSlot):
    """No slot could be leased: the pool is exhausted or the fixed slot is held elsewhere."""


class MessageConflict(CanonicalIdError):
    """A message could not be stored: its (run_id, ts) kept colliding after bounded retries."""
