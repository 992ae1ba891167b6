"""App config: validates the settings and hooks the process life cycle (no queries here)."""

from __future__ import annotations

import os

from django.apps import AppConfig

from processes.conf import get_config

_armed = False


class ProcessesConfig(AppConfig):
    name = "processes"
    verbose_name = "Processes"

    def ready(self) -> None:
        """A forked child forgets its parent's beacon (the row is the parent's, and the beat
        thread did not survive the fork); each django-q2 worker process registers itself as
        it is spawned, so the operator sees it and the job it runs."""
        global _armed
        get_config()  # a malformed setting fails at start-up
        if _armed:
            return
        _armed = True
        # Imported here: django_q.signals and beacon import models, which the app registry
        # refuses while apps.py is loading.
        from django_q.signals import post_spawn

        from processes import beacon

        os.register_at_fork(after_in_child=beacon.forget_after_fork)
        post_spawn.connect(beacon.register_spawned_worker, dispatch_uid="processes_post_spawn")
