"""State changes of notifications. Every write goes through a named function here."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from notifications.exceptions import NotificationNotOpen
from notifications.models import EmailNotification, NotificationPreference

logger = logging.getLogger(__name__)


def notification_mark_responded(
    *, notification_id: int, responded_at: datetime | None = None
) -> EmailNotification:
    """Mark a sent notification answered and reset the user's missed-reply count.

    Called by the inbound-email app only after the reply was handled durably (I8). Runs in
    the caller's transaction if there is one, so "responded" commits together with the reply.
    Raises NotificationNotOpen when the row is not in `sent` (already answered, expired, ...).
    """
    responded_at = responded_at or timezone.now()
    with transaction.atomic():
        notification = EmailNotification.objects.select_for_update().get(pk=notification_id)
        if notification.status != EmailNotification.Status.SENT:
            raise NotificationNotOpen(
                f"notification {notification_id} is {notification.status}, not sent"
            )
        notification.status = EmailNotification.Status.RESPONDED
        notification.responded_at = responded_at
        notification.save(update_fields=["status", "responded_at", "updated_at"])
        NotificationPreference.objects.get_or_create(user_id=notification.user_id)
        NotificationPreference.objects.filter(user_id=notification.user_id).update(
            consecutive_missed=0
        )
    logger.info(
        "notification %s marked responded",
        notification_id,
        extra={"action": "notification_responded", "notification_id": notification_id},
    )
    return notification
