"""App config: validates the settings and hooks the process life cycle (no queries here)."""

from __future__ import annotations

import gc
import os

from django.apps import AppConfig

from processes.conf import get_config

_armed = False


class ProcessesConfig(AppConfig):
    name = "processes"
    verbose_name = "Processes"

    def ready(self) -> None:
        """A forked child forgets its parent's beacon (the row is the parent's, and the beat
        thread did not survive the fork) and leaves the objects it inherited to the parent
        (gc.freeze, tests/processes/test_fork_memory.py); each django-q2 worker process
        registers itself as it is spawned, so the operator sees it and the job it runs."""
        global _armed
        get_config()  # a malformed setting fails at start-up
        if _armed:
            return
        _armed = True
        # Imported here: django_q.signals and beacon import models, which the app registry
        # refuses while apps.py is loading.
        from django_q.signals import post_spawn

        from processes import beacon
        from project import db_pool

        # Issue 37, point 4 (memory): what is alive at a fork is frozen, so neither side's
        # cyclic collections write to it again and a django-q2 worker keeps sharing its
        # parent's pages (a worker with 1,000 async tasks in flight un-shared the whole
        # inherited heap: the qcluster's PSS 1.74 x idle; bench/against_pgqueuer.py).
        os.register_at_fork(before=gc.freeze, after_in_child=beacon.forget_after_fork)
        # Django's pool (project/db_pool.py): a forked child starts with a pool of its own and
        # never closes its parent's connections.
        db_pool.install()
        post_spawn.connect(beacon.register_spawned_worker, dispatch_uid="processes_post_spawn")
