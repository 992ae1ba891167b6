"""Keep the attachments of an accepted reply (issue 21): store, record, and say what is left.

Called by the intake in the transaction that records the reply. Each attachment within the
limits (INBOUND_EMAIL_MAX_ATTACHMENT_BYTES, INBOUND_EMAIL_MAX_ATTACHMENTS) is written to the
mail store under INBOUND_EMAIL_ATTACHMENTS_PREFIX, through the same store interface as the
mail (folder or S3), and recorded on the reply with its sanitised name, content type, size
and sha256. One past a limit is recorded all the same, as kept in the raw source only: the
mail's raw bytes are then never cleared (`reply_raw_must_be_kept`).

The key is `<prefix><mail id>/<index>-<file name>`: a retried or reprocessed mail writes the
same keys again (a write that a rolled-back transaction left behind is overwritten, never
duplicated). Its last part is at most 255 bytes (`attachments.safe_filename`).

A write the store refuses, for whatever reason (a name the file system will not take, a
full disk, S3 refusing the key or down), never costs the reply (issue 28.1: a reply was
quarantined after its attempts for its attachment's name): the attachment is recorded as
kept in the raw source with the store's error, and the reply is recorded and relayed.
"""

from __future__ import annotations

import logging

from inbound_email.attachments import MailAttachment, stored_name
from inbound_email.conf import get_config
from inbound_email.exceptions import StoreError
from inbound_email.models import Reply, ReplyAttachment
from inbound_email.stores import MailStore

logger = logging.getLogger(__name__)

State = ReplyAttachment.State


def attachment_key(*, prefix: str, inbound_email_id: int, index: int, filename: str) -> str:
    return f"{prefix}{inbound_email_id}/{stored_name(index=index, filename=filename)}"


def reply_attachments_keep(
    *, reply: Reply, attachments: list[MailAttachment], store: MailStore
) -> list[ReplyAttachment]:
    """Store and record the attachments of `reply` (see the module docstring). A refused
    write is recorded on the attachment, never raised: the reply goes on."""
    config = get_config()
    rows = []
    for attachment in attachments:
        state = State.STORED
        if attachment.kept_in_raw:
            state = State.BODY_CUT
        elif attachment.size > config.max_attachment_bytes:
            state = State.TOO_LARGE
        elif sum(1 for row in rows if row.state == State.STORED) >= config.max_attachments:
            state = State.TOO_MANY
        key, error = "", ""
        if state == State.STORED:
            key = attachment_key(
                prefix=config.attachments_prefix,
                inbound_email_id=reply.inbound_email_id,
                index=attachment.index,
                filename=attachment.filename,
            )
            error = _put(store, key, attachment, reply)
            if error:
                state, key = State.NOT_STORED, ""
        else:
            logger.warning(
                "attachment %s of reply %s (%s bytes) %s: kept in the raw mail only",
                attachment.index,
                reply.pk,
                attachment.size,
                {
                    State.TOO_LARGE: "is over INBOUND_EMAIL_MAX_ATTACHMENT_BYTES",
                    State.TOO_MANY: "is past INBOUND_EMAIL_MAX_ATTACHMENTS",
                }.get(state, "is the body, longer than was read"),
                extra={"action": "attachment_kept_in_raw", "reply_id": reply.pk},
            )
        rows.append(
            ReplyAttachment(
                reply=reply,
                index=attachment.index,
                filename=attachment.filename,
                content_type=attachment.content_type,
                size=attachment.size,
                sha256=attachment.sha256,
                inline=attachment.inline,
                state=state,
                store_key=key,
                store_error=error,
            )
        )
    return ReplyAttachment.objects.bulk_create(rows)


def _put(store: MailStore, key: str, attachment: MailAttachment, reply: Reply) -> str:
    """Write one attachment; "" when stored, else the store's error (logged)."""
    try:
        store.put(key, attachment.data)
    except StoreError as exc:
        logger.warning(
            "attachment %s of reply %s (%s bytes) could not be stored (%s): kept in the raw "
            "mail only: %s",
            attachment.index,
            reply.pk,
            attachment.size,
            "temporary" if exc.transient else "permanent",
            exc,
            extra={
                "action": "attachment_store_failed",
                "reply_id": reply.pk,
                "transient": exc.transient,
            },
        )
        return str(exc)[:2000]
    return ""


def reply_raw_must_be_kept(reply: Reply) -> bool:
    """Whether the mail's raw source still holds content that was not fully handled: an
    attachment kept only there, or one stored but never relayed."""
    return (
        reply.attachments.exclude(state=State.STORED).exists()
        or reply.attachments.filter(relayed_at__isnull=True).exists()
    )
