class NotificationError(Exception):
    """Base of the notifications app's own errors."""


class NotificationNotOpen(NotificationError):
    """The notification can no longer be answered (already responded, expired or never sent)."""


class NotificationNotRetryable(NotificationError):
    """A failed row cannot be queued again (e.g. the user already has an unsent digest)."""
