from django.apps import AppConfig

from notifications.senders import sender_class


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        """A malformed setting or an unknown EMAIL_SENDER stops start-up, naming the variable."""
        sender_class()  # validates every setting of the app (get_config) and imports the sender
        from notifications import checks  # noqa: F401  (registers the system checks, deploy ones too)
