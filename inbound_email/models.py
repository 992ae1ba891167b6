"""The inbound-mail ledger and the replies (ratings + instruction outbox) read from it.

One `InboundEmail` row per store object (unique key) is the claim, the retry counter and the
audit trail: it decides that every object ends processed, rejected or quarantined (I6) and
that a redelivered object or a duplicate Message-ID is handled once. A `Reply` is an accepted
reply: its rating and its instruction, which is relayed through the outbox fields (I8).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class InboundEmail(models.Model):
    class Status(models.TextChoices):
        RECEIVED = "received", "Received (to handle)"
        AWAITING_RELAY = "awaiting_relay", "Awaiting relay (mail kept until posted)"
        PROCESSED = "processed", "Processed"
        REJECTED = "rejected", "Rejected"
        QUARANTINED = "quarantined", "Quarantined"
        DISCARDED = "discarded", "Discarded"

    class Reason(models.TextChoices):
        NONE = "", "—"
        OVERSIZE = "oversize", "Over the size limit (not read)"
        PERMANENT_ERROR = "permanent_error", "Permanent error"
        TOO_MANY_ATTEMPTS = "too_many_attempts", "Too many failed attempts"
        DUPLICATE = "duplicate", "Duplicate Message-ID"
        AUTO_REPLY = "auto_reply", "Auto-reply"
        BOUNCE = "bounce", "Bounce / delivery notification"
        NO_TOKEN = "no_token", "No reply token"
        UNKNOWN_TOKEN = "unknown_token", "Unknown token"
        EXPIRED_TOKEN = "expired_token", "Expired token"
        TOKEN_NOT_OPEN = "token_not_open", "Notification not open for replies"
        SENDER_MISMATCH = "sender_mismatch", "Sender is not the notified address"
        RATE_LIMITED = "rate_limited", "Too many replies for this token this hour"
        INVALID_RATING = "invalid_rating", "Invalid rating"
        EMPTY_REPLY = "empty_reply", "Nothing to act on"
        # A digest has no proposal: nothing in it can route an instruction or a rating.
        NO_PROPOSAL = "no_proposal", "Not a reply to a proposal's email"
        # Parsing limits (issue 10): the detail names the setting that was passed.
        MIME_PARTS_LIMIT = "mime_parts_limit", "Too many MIME parts"
        MIME_DEPTH_LIMIT = "mime_depth_limit", "MIME parts nested too deep"
        HEADER_COUNT_LIMIT = "header_count_limit", "Too many header fields"
        HEADER_SIZE_LIMIT = "header_size_limit", "Header fields too large"
        TEXT_SIZE_LIMIT = "text_size_limit", "Text part too large"
        HTML_DEPTH_LIMIT = "html_depth_limit", "HTML nested too deep"
        # SES verdicts (issue 10): DMARC failed, or with no DMARC verdict SPF and DKIM both did.
        UNAUTHENTICATED_SENDER = (
            "unauthenticated_sender",
            "Sender failed DMARC (or SPF+DKIM)",
        )
        VIRUS = "virus", "Virus found by SES"
        SPAM = "spam", "Spam verdict FAIL from SES"
        # Deleted by someone else (an operator, an S3 lifecycle rule) while still to handle:
        # a reply lost unread, which an operator must hear about.
        VANISHED = "vanished", "Vanished from the store before it was read"

    # Where the object was found (unique: a redelivered object with the same key is one row).
    store_key = models.CharField(max_length=1024, unique=True)
    etag = models.CharField(max_length=200, blank=True)
    size = models.BigIntegerField(default=0)
    # Not indexed (issue 21): nothing looks a mail up by it (duplicates go by `dedup_key`),
    # and its two indexes (b-tree and LIKE) cost 160 bytes a row that a prune cannot give back.
    sha256 = models.CharField(max_length=64, blank=True)
    # Message-ID (or sha256: when it has none); unique among originals -> duplicates rejected.
    dedup_key = models.CharField(max_length=600, blank=True)
    duplicate_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="duplicates"
    )
    message_id = models.CharField(max_length=500, blank=True)
    from_address = models.CharField(max_length=254, blank=True)
    to_addresses = models.TextField(blank=True)
    subject = models.CharField(max_length=500, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True, help_text="The mail's Date header.")
    headers_text = models.TextField(blank=True, help_text="Decoded headers (display only).")
    body_text = models.TextField(blank=True, help_text="Decoded text body (display only).")
    # The raw source, kept while anything depends on it (cleared once processed).
    raw = models.BinaryField(null=True, blank=True, editable=False)
    notification = models.ForeignKey(
        "notifications.EmailNotification",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="inbound_emails",
    )

    # The notice telling the PI why their reply was rejected (issue 13), when one was queued.
    rejection_notice = models.ForeignKey(
        "notifications.EmailNotification",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="rejected_replies",
    )

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RECEIVED)
    reason = models.CharField(max_length=30, choices=Reason.choices, blank=True, default="")
    detail = models.TextField(blank=True, help_text="Human-readable reason.")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, help_text="Last exception with traceback.")
    # Set once the object was moved to the quarantine prefix.
    quarantine_key = models.CharField(max_length=1100, blank=True)
    intake_deleted = models.BooleanField(default=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    TERMINAL_STATUSES = (
        Status.PROCESSED,
        Status.REJECTED,
        Status.QUARANTINED,
        Status.DISCARDED,
    )

    class Meta:
        verbose_name = "inbound email"
        indexes = [
            models.Index(fields=["status", "next_attempt_at"]),
            models.Index(fields=["status", "created_at"]),
            # The retention prune's scan (issue 21): finished rows, oldest first.
            models.Index(fields=["status", "finished_at"], name="inbound_email_finished"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["dedup_key"],
                condition=~Q(dedup_key="") & Q(duplicate_of__isnull=True),
                name="inbound_email_one_original_per_message_id",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.store_key} ({self.status})"


class Reply(models.Model):
    """An accepted reply: a rating and/or an instruction relayed through an outbox."""

    class RelayStatus(models.TextChoices):
        NONE = "none", "No instruction"
        PENDING = "pending", "Pending (retrying)"
        # Claimed and committed before the Slack post; the outcome is recorded afterwards. A
        # row still here after INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS lost its worker between
        # the post and the record: it is looked up in Slack before any new post.
        POSTING = "posting", "Posting (claimed; outcome not yet recorded)"
        POSTED = "posted", "Posted to Slack"
        INBOXED = "inboxed", "Recorded in the database inbox"

    inbound_email = models.OneToOneField(
        InboundEmail, on_delete=models.PROTECT, related_name="reply"
    )
    # PROTECT: deleting a notification (or its proposal) must not delete an accepted reply,
    # which would strand its mail in awaiting_relay and lose the instruction.
    notification = models.ForeignKey(
        "notifications.EmailNotification", on_delete=models.PROTECT, related_name="replies"
    )
    rating = models.PositiveSmallIntegerField(null=True, blank=True)
    rating_error = models.CharField(max_length=300, blank=True)
    instruction = models.TextField(blank=True)
    stripped_text = models.TextField(
        blank=True,
        help_text="Text of the mail that was not relayed: quoted history, signature, text "
        "after a separator line (kept so nothing the PI wrote is lost).",
    )
    cut_lines = models.PositiveIntegerField(
        default=0,
        help_text="Lines of the stripped text that may be the PI's own (all but the quote of "
        "the mail answered); the relayed message says when there are any.",
    )

    relay_status = models.CharField(
        max_length=10, choices=RelayStatus.choices, default=RelayStatus.NONE
    )
    relay_attempts = models.PositiveIntegerField(default=0)
    relay_next_attempt_at = models.DateTimeField(null=True, blank=True)
    relay_last_error = models.TextField(blank=True)
    relay_claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="When the current or last relay attempt was claimed."
    )
    relay_unsure_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A post since then may have reached Slack unconfirmed (timeout, 5xx, reset, "
        "crash): the channel is searched for it before any new post or the inbox fallback.",
    )
    relay_files_attempts = models.PositiveIntegerField(
        default=0,
        help_text="Attempts to share the attachments in the instruction's Slack thread (after "
        "the message was posted); their own budget of INBOUND_RELAY_MAX_ATTEMPTS.",
    )
    relay_unsure_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="An unconfirmed post may still show up in the channel until then (two claim "
        "timeouts after the claim that sent it): a look-up before then that does not find it "
        "is waited out, never followed by a new post or the inbox.",
    )
    slack_channel = models.CharField(max_length=64, blank=True)
    slack_ts = models.CharField(max_length=32, blank=True)
    message_ts = models.CharField(
        max_length=32, blank=True, help_text="Canonical id of the database-inbox message."
    )
    needs_operator = models.BooleanField(
        default=False, help_text="Slack never accepted it: it went to the database inbox."
    )
    operator_acknowledged_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="An operator handled the instruction that needed one (clears the alarm).",
    )
    relayed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "replies"
        indexes = [
            models.Index(fields=["notification", "created_at"]),
            models.Index(fields=["relay_status", "relay_next_attempt_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(rating__isnull=True) | Q(rating__gte=1, rating__lte=5),
                name="reply_rating_between_1_and_5",
            ),
            models.CheckConstraint(
                condition=~Q(relay_status="posting") | Q(relay_claimed_at__isnull=False),
                name="reply_posting_has_a_claim_time",
            ),
        ]

    def __str__(self) -> str:
        return f"reply #{self.pk} to notification {self.notification_id}"


class ReplyAttachment(models.Model):
    """An attachment of an accepted reply (issue 21): stored under the store's attachments
    prefix and relayed with the instruction (shared in its Slack thread, or listed in the
    database inbox with an admin download). One too large, or past the count limit, is only
    recorded: its bytes stay in the mail's raw source, which is then kept."""

    class State(models.TextChoices):
        STORED = "stored", "Stored"
        TOO_LARGE = "too_large", "Kept in raw, too large"
        TOO_MANY = "too_many", "Kept in raw, past the count limit"
        # The body, longer than the reader keeps (parsing.MAX_BODY_CHARS): only its start
        # was read; the whole is in the raw source, which is kept.
        BODY_CUT = "body_cut", "Kept in raw, the body is longer than was read"
        # The store refused the write (issue 28.1): the reply goes on, the bytes stay in the
        # raw source, and `store_error` says why.
        NOT_STORED = "not_stored", "Kept in raw, the store write failed"

    reply = models.ForeignKey(Reply, on_delete=models.CASCADE, related_name="attachments")
    index = models.PositiveSmallIntegerField(help_text="1-based, in the order of the mail.")
    filename = models.CharField(max_length=255, help_text="Sanitised: no path, no control.")
    content_type = models.CharField(max_length=200)
    size = models.BigIntegerField(help_text="Bytes, decoded.")
    sha256 = models.CharField(max_length=64)
    inline = models.BooleanField(default=False)
    state = models.CharField(max_length=10, choices=State.choices)
    store_key = models.CharField(max_length=1100, blank=True)
    # A database default too: the previous release inserts rows without it (I23).
    store_error = models.TextField(
        blank=True, default="", db_default="", help_text="Why the store refused the write."
    )
    slack_file_id = models.CharField(max_length=64, blank=True)
    relayed_at = models.DateTimeField(
        null=True, blank=True, help_text="Shared in Slack, or listed in the database inbox."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("reply", "index")
        constraints = [
            models.UniqueConstraint(fields=["reply", "index"], name="reply_attachment_index"),
        ]

    def __str__(self) -> str:
        return f"{self.filename} (reply #{self.reply_id})"
