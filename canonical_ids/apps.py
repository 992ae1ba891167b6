"""App config: arms the writer-slot claim for the configured role (no queries here)."""

from __future__ import annotations

import atexit
import logging
import os

from django.apps import AppConfig

from canonical_ids.conf import get_config

logger = logging.getLogger(__name__)

_armed = False


class CanonicalIdsConfig(AppConfig):
    name = "canonical_ids"
    verbose_name = "Canonical ids"

    def ready(self) -> None:
        """Validate the settings and hook the process life cycle; never touch the database.

        The slot itself is claimed lazily on the first mint (so `migrate` on a fresh database
        and commands that never mint need no slot) and eagerly in each django-q2 worker
        process right after it is spawned. A forked child drops the inherited slot.
        """
        global _armed
        get_config()  # a malformed setting fails at start-up
        if _armed:
            return
        _armed = True
        # Imported here, not at the top: both import models (django_q.models; hooks -> minter
        # -> leases -> our models), which the app registry refuses while apps.py is loading.
        from django_q.signals import post_spawn

        from canonical_ids import hooks

        os.register_at_fork(after_in_child=hooks.drop_slot_after_fork)
        post_spawn.connect(hooks.claim_slot_on_spawn, dispatch_uid="canonical_ids_post_spawn")
        atexit.register(hooks.release_slot_at_exit)
