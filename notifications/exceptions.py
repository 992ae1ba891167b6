class NotificationError(Exception):
    """Base of the notifications app's own errors."""


class NotificationNotOpen(NotificationError):
    """The notification can no longer be answered (already responded, expired or never sent)."""


class SendError(NotificationError):
    """The mail service did not accept a message; the row goes back to pending (or failed)."""
