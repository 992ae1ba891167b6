from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        """Check every django-q2 task against the allowlist before it is enqueued (issue 19).

        Imported here, not at the top: the guard imports models, which the app registry
        refuses while apps.py is loading.
        """
        from django_q.signals import pre_enqueue

        from ops.task_guard import refuse_on_enqueue

        pre_enqueue.connect(refuse_on_enqueue, dispatch_uid="ops_task_guard_pre_enqueue")

        from ops import checks  # noqa: F401  (registers the database check)
