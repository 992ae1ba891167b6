from django.apps import AppConfig

from jobs.conf import get_config


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        """A malformed setting stops start-up with a message naming the variable; a qcluster
        worker process keeps its database session between tasks."""
        get_config()
        # Imported here: django_q.signals imports models, which the app registry refuses
        # while apps.py is loading.
        from django_q.signals import post_spawn

        from jobs.worker_session import keep_session_on_spawn

        # A qcluster worker keeps its database session between tasks (issue 37, point 1).
        post_spawn.connect(keep_session_on_spawn, dispatch_uid="jobs_keep_worker_session")
