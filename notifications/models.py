"""Proposals, per-user notification preferences and the email-notification rows.

The inbound-email app depends on `EmailNotification` (token, to_address, status) and on
`notifications.services.notification_mark_responded`; keep those stable.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q


def new_reply_token() -> str:
    """128 random bits as 32 hex digits: unguessable, and short enough that the plus-address
    (replies+TOKEN@domain) keeps its local part within RFC 5321's 64 octets."""
    return secrets.token_hex(16)


class Proposal(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        IN_REVIEW = "in_review", "In review"
        SUBMITTED = "submitted", "Submitted"
        ARCHIVED = "archived", "Archived"

    title = models.CharField(max_length=300)
    pi = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="proposals"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.DRAFT)
    run_id = models.CharField(
        max_length=64, blank=True, help_text="The agent run whose conversation this belongs to."
    )
    slack_channel = models.CharField(
        max_length=64, blank=True, help_text="Slack channel id where PI instructions are relayed."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        return self.title


class NotificationPreference(models.Model):
    class Rung(models.TextChoices):
        IMMEDIATE = "immediate", "Immediate"
        DAILY = "daily", "Daily digest"
        WEEKLY = "weekly", "Weekly digest"
        PAUSED = "paused", "Paused"

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    rung = models.CharField(max_length=20, choices=Rung.choices, default=Rung.IMMEDIATE)
    consecutive_missed = models.PositiveIntegerField(default=0)
    downgraded_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(rung__in=["immediate", "daily", "weekly", "paused"]),
                name="notification_preference_rung_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.rung})"


class EmailNotification(models.Model):
    class Kind(models.TextChoices):
        NEW_PROPOSAL = "new_proposal", "New proposal"
        PROPOSAL_REVIEW = "proposal_review", "Proposal review request"
        DIGEST = "digest", "Digest"
        # A word back to the PI: their reply to `about` was not acted on (notice_reason).
        REPLY_REJECTED = "reply_rejected", "Reply not acted on (notice)"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending (claimed)"
        SENT = "sent", "Sent"
        RESPONDED = "responded", "Responded"
        EXPIRED = "expired", "Expired"
        FAILED = "failed", "Failed"

    class FailureReason(models.TextChoices):
        NONE = "", "—"
        INVALID_ADDRESS = "invalid_address", "Invalid recipient address (never sent)"
        SEND_REFUSED = "send_refused", "Refused by the mail service on every attempt"
        CLAIM_TIMED_OUT = "claim_timed_out", "Worker lost while sending, on the last attempt"

    OPEN_STATUSES = (Status.PENDING, Status.SENDING, Status.SENT)
    SENT_STATUSES = (Status.SENT, Status.RESPONDED, Status.EXPIRED)

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="email_notifications"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    proposal = models.ForeignKey(
        Proposal, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    token = models.CharField(max_length=64, unique=True, default=new_reply_token, editable=False)
    to_address = models.EmailField(
        blank=True, help_text="The address the mail went to; only it may reply."
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    # db_default: the web app and the bot insert rows too, without knowing this column.
    failure_reason = models.CharField(
        max_length=30, choices=FailureReason.choices, blank=True, default="", db_default=""
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    # reply_rejected only: the notification whose reply was rejected, and why (an
    # inbound_email reason code; the template words it).
    about = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="notices"
    )
    notice_reason = models.CharField(max_length=30, blank=True, default="", db_default="")
    retry_after = models.DateTimeField(
        null=True, blank=True, help_text="A pending row is not claimed again before this time."
    )
    sent_at = models.DateTimeField(null=True, blank=True)
    ses_message_id = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    responded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "expires_at"]),
            models.Index(fields=["kind", "status"]),
            models.Index(fields=["user", "status"]),
            models.Index(fields=["user", "kind", "-sent_at"], name="notif_user_kind_sent_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "proposal"],
                condition=Q(kind="proposal_review", status__in=["pending", "sending", "sent"]),
                name="one_open_review_request_per_user_and_proposal",
            ),
            models.UniqueConstraint(
                fields=["user", "proposal"],
                condition=Q(kind="new_proposal"),
                name="one_new_proposal_notice_per_user_and_proposal",
            ),
            models.CheckConstraint(
                condition=~Q(status__in=["sent", "responded", "expired"])
                | (~Q(ses_message_id="") & Q(sent_at__isnull=False)),
                name="sent_notification_has_message_id",
            ),
            models.UniqueConstraint(
                fields=["user"],
                condition=Q(kind="digest", status__in=["pending", "sending"]),
                name="one_unsent_digest_per_user",
            ),
            models.CheckConstraint(
                condition=~Q(status="sending") | Q(claimed_at__isnull=False),
                name="sending_notification_has_claimed_at",
            ),
            models.CheckConstraint(
                condition=~Q(status="responded") | Q(responded_at__isnull=False),
                name="responded_notification_has_responded_at",
            ),
            models.CheckConstraint(
                condition=Q(
                    status__in=["pending", "sending", "sent", "responded", "expired", "failed"]
                ),
                name="notification_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} to user {self.user_id} ({self.status})"


class SendingState(models.Model):
    """The one row (pk 1) every worker process paces its sends by: the account's send rate
    and daily quota as SES last reported them, the token bucket's next free slot, and the
    pause a daily-quota answer starts (notifications/pacing.py).

    In the database, not in memory, so the pace and the pause hold for every process of every
    worker container together.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    max_send_rate = models.FloatField(
        null=True, blank=True, help_text="Mails per second (SES GetSendQuota, or the override)."
    )
    max_24_hour_send = models.FloatField(
        null=True, blank=True, help_text="SES's daily quota (-1: unlimited)."
    )
    sent_last_24_hours = models.FloatField(null=True, blank=True)
    quota_checked_at = models.DateTimeField(null=True, blank=True)
    next_slot_at = models.DateTimeField(
        null=True, blank=True, help_text="The token bucket: no send leaves before this time."
    )
    paused_until = models.DateTimeField(
        null=True, blank=True, help_text="All sending waits until then (daily quota reached)."
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_reason = models.TextField(blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="sending_state_single_row"),
        ]

    def __str__(self) -> str:
        return "sending state"
