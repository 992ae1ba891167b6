"""The database inbox, the relay's fallback: the instruction recorded as a canonical_ids
Message (with a minted id), its attachments listed with where an operator downloads them.
Never on top of a post Slack accepted: then only the attachments are listed.
"""

from __future__ import annotations

import logging

from django.urls import reverse
from django.utils import timezone

from canonical_ids import record_message
from inbound_email.models import Reply, ReplyAttachment
from inbound_email.services.relay_message import cut_text_note

logger = logging.getLogger(__name__)


def _inbox(reply: Reply, *, fallback_error: str, attachments_only: bool = False) -> None:
    """Record the instruction in the database inbox (a Message with a minted canonical id),
    with its attachments listed; `attachments_only` when the instruction itself is in Slack
    (never inboxed on top of a post Slack accepted)."""
    notification = reply.notification
    proposal = notification.proposal
    note = "\n".join(filter(None, [cut_text_note(reply), _inbox_attachments_text(reply)]))
    attachments = list(reply.attachments.all())
    text = reply.instruction + (f"\n{note}" if note else "")
    if attachments_only:
        text = (
            f"Attachments of reply #{reply.pk} (its instruction is in Slack, "
            f"{reply.slack_ts}):\n{_inbox_attachments_text(reply)}"
        )
    message = record_message(
        run_id=(proposal.run_id if proposal else "")[:64],
        text=text,
        author=f"pi:{notification.user_id}",
        source="email",
        metadata={
            "reply_id": reply.pk,
            "notification_id": notification.pk,
            "inbound_email_id": reply.inbound_email_id,
            "rating": reply.rating,
            "slack_failed": bool(fallback_error),
            "cut_lines": reply.cut_lines,
            "attachments": [
                {
                    "id": a.pk,
                    "filename": a.filename,
                    "content_type": a.content_type,
                    "size": a.size,
                    "sha256": a.sha256,
                    "state": a.state,
                    "download": _download_path(a),
                }
                for a in attachments
            ],
        },
    )
    now = timezone.now()
    stored = [a for a in attachments if a.state == ReplyAttachment.State.STORED]
    for attachment in stored:
        attachment.relayed_at = attachment.relayed_at or now
    ReplyAttachment.objects.bulk_update(stored, ["relayed_at"])
    reply.message_ts = message.ts
    reply.relay_status = Reply.RelayStatus.POSTED if attachments_only else Reply.RelayStatus.INBOXED
    if fallback_error:
        reply.needs_operator = True
        reply.relay_last_error = fallback_error[:2000]
        logger.error(
            "instruction of reply %s never reached Slack after %s attempts; recorded in the "
            "database inbox as %s for an operator: %s",
            reply.pk,
            reply.relay_attempts,
            message.ts,
            fallback_error,
            extra={"action": "instruction_inbox_fallback", "reply_id": reply.pk},
        )


def _download_path(attachment: ReplyAttachment) -> str:
    """Where an operator downloads it in the admin: the stored file, else the raw mail."""
    if attachment.state == ReplyAttachment.State.STORED:
        return reverse("admin:inbound_email_replyattachment_download", args=[attachment.pk])
    return reverse("admin:inbound_email_inboundemail_raw", args=[attachment.reply.inbound_email_id])


def _inbox_attachments_text(reply: Reply) -> str:
    """One line per attachment in the inbox message: name, type, size, sha256, download."""
    lines = []
    for a in reply.attachments.all():
        where = "download" if a.state == ReplyAttachment.State.STORED else a.get_state_display()
        lines.append(
            f"[attachment {a.index}: {a.filename} ({a.content_type}, {a.size} bytes, sha256 "
            f"{a.sha256}); {where}: {_download_path(a)}]"
        )
    return "\n".join(lines)
