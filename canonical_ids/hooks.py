"""Process life-cycle hooks of the minter (wired in apps.CanonicalIdsConfig.ready)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from canonical_ids.conf import NO_ROLES, get_config
from canonical_ids.exceptions import NoWriterSlot
from canonical_ids.minter import get_minter

logger = logging.getLogger(__name__)


def drop_slot_after_fork() -> None:
    get_minter().after_fork_in_child()


def claim_slot_on_spawn(sender: Any = None, proc_name: str = "", **kwargs: Any) -> None:
    """Claim the slot as a django-q2 worker process starts, so the admin shows its holder.

    A failure here is not fatal: the first mint claims again and raises if it still cannot.
    """
    if get_config().role in NO_ROLES:
        return
    try:
        slot = get_minter().acquire()
    except (DatabaseError, NoWriterSlot):
        logger.exception(
            "Could not claim a writer slot in %s; will retry on first mint",
            proc_name,
            extra={"action": "slot_claim_failed"},
        )
        return
    logger.info(
        "%s holds writer slot %s",
        proc_name,
        slot,
        extra={"action": "slot_claimed_on_spawn", "slot": slot},
    )


def release_slot_at_exit() -> None:
    try:
        get_minter().release()
    except DatabaseError:
        logger.warning(
            "Could not release the writer slot at exit; it frees when its lease expires",
            exc_info=True,
            extra={"action": "slot_release_failed"},
        )
