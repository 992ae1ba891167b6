from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        """A malformed setting stops start-up with a message naming the variable."""
        from jobs.conf import get_config

        get_config()
