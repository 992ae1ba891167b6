"""After commit, the store follows the ledger: finished mail leaves the intake.

Runs after the outcomes committed (the poller per page, the relay on commit), and again on any
later poll that still lists a key (a failed delete, or a redelivery of a handled object): the
ledger is the truth, the store follows it. A quarantined mail is copied to the quarantine
prefix first; if that copy fails it stays in the intake (never deleted uncopied) and the next
poll tries again. Only keys whose delete succeeded are marked `intake_deleted`.
"""

from __future__ import annotations

import logging

from django.db import transaction

from inbound_email.exceptions import StoreError, StoreNotFound
from inbound_email.models import InboundEmail
from inbound_email.stores import MailStore

logger = logging.getLogger(__name__)

Status = InboundEmail.Status


def inbound_email_finalize(*, ids: list[int], store: MailStore) -> int:
    """Make the store match finished rows: delete intake objects, move quarantined ones.

    Returns how many rows are in line. Rows another transaction holds (a reprocess in
    progress) are left alone.
    """
    if not ids:
        return 0
    with transaction.atomic():
        rows = list(
            InboundEmail.objects.select_for_update(skip_locked=True)
            .filter(pk__in=ids, status__in=InboundEmail.TERMINAL_STATUSES)
            .only("id", "store_key", "status", "quarantine_key")
        )
        ready = []
        for row in rows:
            if row.status == Status.QUARANTINED and not row.quarantine_key:
                try:
                    row.quarantine_key = store.quarantine(row.store_key)
                except StoreNotFound:
                    pass  # nothing left in the intake to move
                except StoreError as exc:
                    _log_cleanup_failure(row, exc)
                    continue
                row.save(update_fields=["quarantine_key"])
            ready.append(row)
        try:
            failed = store.delete_many([row.store_key for row in ready])
        except StoreError as exc:
            for row in ready:
                _log_cleanup_failure(row, exc)
            return 0
        for row in ready:
            if row.store_key in failed:
                _log_cleanup_failure(row, StoreError(failed[row.store_key], transient=True))
        done = [row.pk for row in ready if row.store_key not in failed]
        InboundEmail.objects.filter(pk__in=done).update(intake_deleted=True)
        return len(done)


def store_delete_quietly(store: MailStore, key: str) -> None:
    """Delete a copy whose removal is only tidying (a reprocessed mail's quarantine copy, after
    commit): a failure is logged, never raised, and loses no mail."""
    try:
        store.delete(key)
    except StoreError as exc:
        logger.warning("could not delete %s: %s", key, exc, extra={"action": "mail_cleanup_failed"})


def _log_cleanup_failure(row: InboundEmail, exc: Exception) -> None:
    logger.warning(
        "mail #%s: store clean-up failed, retried on the next poll: %s",
        row.pk,
        exc,
        extra={"action": "mail_cleanup_failed", "mail_key": row.store_key},
    )
