"""Operator actions (the admin calls these): read the raw source, reprocess, discard,
acknowledge an instruction that needed an operator. Each checks the row's status under its
lock and raises `MailNotInState` rather than act on a mail in the wrong state."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from inbound_email.exceptions import MailNotInState
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.services.ledger import raw_is_cut
from inbound_email.services.store_sync import store_delete_quietly
from inbound_email.stores import MailStore, default_store
from project.db_clock import db_now

logger = logging.getLogger(__name__)

Status = InboundEmail.Status
Reason = InboundEmail.Reason


def _lock_settled_mail(inbound_email_id: int) -> InboundEmail:
    """The row, locked, if an operator may act on it: only mail no poller will touch again."""
    row = InboundEmail.objects.select_for_update().get(pk=inbound_email_id)
    if row.status not in (Status.QUARANTINED, Status.REJECTED):
        raise MailNotInState(f"mail #{row.pk} is {row.status}: only quarantined or rejected")
    return row


def inbound_email_raw(*, inbound_email: InboundEmail, store: MailStore | None = None) -> bytes:
    """The raw source: from the row, else from the quarantine copy, else from the intake."""
    if inbound_email.raw is not None:
        return bytes(inbound_email.raw)
    store = store or default_store()
    if inbound_email.quarantine_key:
        return store.get_quarantined(inbound_email.quarantine_key)
    return store.get(inbound_email.store_key)


def attachment_content(*, attachment: ReplyAttachment, store: MailStore | None = None) -> bytes:
    """A stored attachment's bytes from the store (MailNotInState when it was kept only in
    the raw mail: download the mail then)."""
    if attachment.state != ReplyAttachment.State.STORED or not attachment.store_key:
        raise MailNotInState(
            f"attachment #{attachment.pk} was not stored ({attachment.get_state_display()})"
        )
    return (store or default_store()).get(attachment.store_key)


def inbound_email_reprocess(*, inbound_email_id: int, store: MailStore | None = None) -> None:
    """Put a quarantined or rejected mail back in the intake with a fresh attempt budget."""
    store = store or default_store()
    with transaction.atomic():
        row = _lock_settled_mail(inbound_email_id)
        if raw_is_cut(row):
            raise MailNotInState(
                f"mail #{row.pk} kept only the first {len(row.raw)} of its {row.size} bytes "
                "(rejected mail is cut): it cannot be reprocessed; download what is kept"
            )
        data = inbound_email_raw(inbound_email=row, store=store)
        store.put(row.store_key, data)  # under the row lock: no poller finalizes it meanwhile
        if row.quarantine_key:
            quarantine_key = row.quarantine_key
            transaction.on_commit(lambda: store_delete_quietly(store, quarantine_key))
        row.status = Status.RECEIVED
        row.reason = Reason.NONE
        row.detail = f"reprocess requested after {row.attempts} attempts"
        row.attempts = 0
        row.next_attempt_at = db_now()
        row.quarantine_key = ""
        row.intake_deleted = False
        row.duplicate_of = None
        row.dedup_key = ""
        row.finished_at = None
        row.save()
    logger.info(
        "mail #%s queued for reprocessing",
        row.pk,
        extra={"action": "mail_reprocess", "mail_key": row.store_key},
    )


def inbound_email_discard(*, inbound_email_id: int, store: MailStore | None = None) -> None:
    """Drop a quarantined or rejected mail for good: its stored copies and raw bytes."""
    store = store or default_store()
    with transaction.atomic():
        row = _lock_settled_mail(inbound_email_id)
        for key in filter(None, [row.quarantine_key, row.store_key]):
            store.delete(key)
        row.status = Status.DISCARDED
        row.raw = None
        row.intake_deleted = True
        row.save()
    logger.info(
        "mail #%s discarded", row.pk, extra={"action": "mail_discard", "mail_key": row.store_key}
    )


def reply_acknowledge(*, reply_ids: list[int]) -> int:
    """An operator handled instructions that needed one: clear their alarm (kept as history).

    Only replies that need an operator and are not yet acknowledged change; returns how many.
    """
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            Reply.objects.select_for_update()
            .filter(pk__in=reply_ids, needs_operator=True, operator_acknowledged_at__isnull=True)
            .values_list("pk", flat=True)
        )
        Reply.objects.filter(pk__in=ids).update(operator_acknowledged_at=now)
    for reply_id in ids:
        logger.info(
            "reply %s acknowledged by an operator",
            reply_id,
            extra={"action": "reply_acknowledged", "reply_id": reply_id},
        )
    return len(ids)
