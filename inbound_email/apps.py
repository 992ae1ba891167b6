from django.apps import AppConfig


class InboundEmailConfig(AppConfig):
    name = "inbound_email"
    verbose_name = "Inbound email"

    def ready(self) -> None:
        from inbound_email import checks  # noqa: F401  (registers the system checks)
