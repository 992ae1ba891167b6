from django.apps import AppConfig

from jobs.conf import get_config


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        """A malformed setting stops start-up with a message naming the variable."""
        get_config()
