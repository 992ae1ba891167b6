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
        # Never sent: the address is on the suppression list (a hard bounce, a complaint, or
        # three soft bounces in 7 days). Final, like failed.
        SUPPRESSED = "suppressed", "Suppressed (address bounced or complained)"

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
                    status__in=[
                        "pending",
                        "sending",
                        "sent",
                        "responded",
                        "expired",
                        "failed",
                        "suppressed",
                    ]
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


class DeliveryFeedback(models.Model):
    """One bounce or complaint about an address we mailed, as a report told it: a DSN
    (RFC 3464) or an ARF report (RFC 5965) that reached the inbound address, or an SES event
    through SNS. notifications/suppression.py turns these into suppressions."""

    class Kind(models.TextChoices):
        HARD_BOUNCE = "hard_bounce", "Hard bounce (permanent)"
        SOFT_BOUNCE = "soft_bounce", "Soft bounce (transient)"
        COMPLAINT = "complaint", "Complaint (marked as spam)"

    class Source(models.TextChoices):
        DSN = "dsn", "Delivery status notification (inbound mail)"
        ARF = "arf", "Abuse feedback report (inbound mail)"
        SES_EVENT = "ses_event", "SES event notification (SNS)"

    address = models.CharField(max_length=320, db_index=True, help_text="Lower-cased.")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    source = models.CharField(max_length=20, choices=Source.choices)
    report = models.TextField(
        blank=True, help_text="Where it came from (mail key, SNS message id) and what it said."
    )
    occurred_at = models.DateTimeField(db_index=True)
    # What the report is about, the same whichever door it came through: the kind, the
    # recipient and the bounced message (`suppression.feedback_event_key`). Unique, so a
    # redelivered SNS message, or a DSN about a message SES also reported, is recorded once
    # whatever the concurrency (issue 28.2). Null on rows recorded before it existed (and on
    # rows the previous release still writes during a rolling deploy).
    event_key = models.CharField(max_length=600, null=True, blank=True, editable=False)

    class Meta:
        indexes = [models.Index(fields=["address", "kind", "occurred_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["hard_bounce", "soft_bounce", "complaint"]),
                name="delivery_feedback_kind_valid",
            ),
            models.UniqueConstraint(fields=["event_key"], name="delivery_feedback_one_per_event"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}"


class Suppression(models.Model):
    """An address the sweeps never mail (their rows end `suppressed`): one row per address.

    Active while not lifted and not past `expires_at` (soft bounces suppress for 7 days; a
    hard bounce, a complaint or an operator's hand suppression for good). Lifting it
    ("unsuppress") needs the `notifications.unsuppress` permission and is logged in the
    admin's history.
    """

    class Reason(models.TextChoices):
        HARD_BOUNCE = "hard_bounce", "Hard bounce"
        COMPLAINT = "complaint", "Complaint"
        SOFT_BOUNCES = "soft_bounces", "Three soft bounces in 7 days"
        MANUAL = "manual", "Suppressed by an operator"

    address = models.CharField(max_length=320, unique=True, help_text="Lower-cased.")
    reason = models.CharField(max_length=20, choices=Reason.choices)
    source_report = models.TextField(blank=True, help_text="The report that suppressed it.")
    suppressed_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: for good.")
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.CharField(max_length=150, blank=True)
    # Issue 31.6. db_default too: the previous release's code inserts rows without it (I23).
    suppressed_by = models.CharField(
        max_length=150,
        blank=True,
        default="",
        db_default="",
        help_text="The operator who suppressed it by hand (empty: a report did).",
    )

    class Meta:
        permissions = [("unsuppress", "Can lift a suppression (mail the address again)")]

    def __str__(self) -> str:
        return f"suppression #{self.pk} ({self.reason})"


class UnsubscribeRevocation(models.Model):
    """A one-click unsubscribe link that no longer works (issue 23): the links never expire,
    so an operator revokes one here (e.g. a mail forwarded to a list that keeps clicking)."""

    notification = models.OneToOneField(
        EmailNotification, on_delete=models.CASCADE, related_name="unsubscribe_revocation"
    )
    revoked_at = models.DateTimeField(auto_now_add=True)
    reason = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"revoked unsubscribe link of notification {self.notification_id}"


class SweepLease(models.Model):
    """Which worker runs a cycle of a sweep now: one row per sweep kind (issue 22).

    A lease on the database's clock, not a session advisory lock: behind PgBouncer in
    transaction pooling a session lock is taken on one server connection and released on
    whichever serves the client next (or shared by every client of that server connection),
    and a host's clock may be minutes off. Taken while `expires_at` has passed, renewed by the
    holder while its cycle runs, deleted when it ends; a holder that died stops renewing and
    its lease expires after NOTIFICATION_SWEEP_LEASE_SECONDS (notifications/sweep_lease.py).
    """

    kind = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=255, help_text="host:pid:token of the running cycle")
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.kind} sweep lease ({self.holder})"
