class NotificationError(Exception):
    """Base of the notifications app's own errors."""


class NotificationNotOpen(NotificationError):
    """The notification can no longer be answered (already responded, expired or never sent)."""


class NotificationNotRetryable(NotificationError):
    """A failed row cannot be queued again (e.g. the user already has an unsent digest)."""


class SnsMessageRefused(NotificationError):
    """An SNS message to /ses/events is not believed or not usable; `status` is the HTTP answer
    (4xx: never worth sending again; 503: SNS should retry later) and the text says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class AlreadySuppressed(NotificationError):
    """An operator asked to suppress an address that is suppressed already."""
