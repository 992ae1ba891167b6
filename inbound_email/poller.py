"""The poll loop: list the intake page by page, hand each object to the per-object service.

A run is bounded (INBOUND_EMAIL_MAX_PER_RUN objects handled) and never stopped by one object:
`inbound_email_handle` records every error on the object's row. Two pollers at once are safe:
rows are created with INSERT .. ON CONFLICT DO NOTHING and claimed with FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from inbound_email.conf import get_config
from inbound_email.exceptions import StoreError
from inbound_email.models import InboundEmail
from inbound_email.services.intake import (
    inbound_email_due_unlisted,
    inbound_email_handle,
    inbound_email_register,
)
from inbound_email.services.relay import reply_relay_sweep
from inbound_email.services.store_sync import inbound_email_finalize
from inbound_email.stores import MailStore, default_store
from processes.beacon import doing
from project.db_clock import db_now

logger = logging.getLogger(__name__)


@dataclass
class PollSummary:
    listed: int = 0
    handled: int = 0
    outcomes: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    limit_reached: bool = False
    list_error: str = ""

    def as_dict(self) -> dict:
        return {
            "listed": self.listed,
            "handled": self.handled,
            "outcomes": dict(self.outcomes),
            "seconds": round(self.seconds, 3),
            "limit_reached": self.limit_reached,
            "list_error": self.list_error,
        }


def poll_once(*, store: MailStore | None = None, limit: int | None = None) -> PollSummary:
    """One bounded pass over the intake."""
    store = store or default_store()
    limit = limit or get_config().max_per_run
    summary = PollSummary()
    started = time.monotonic()
    listed_since = db_now()
    try:
        for page in store.list():
            summary.listed += len(page)
            if not page:
                continue
            rows = inbound_email_register(objects=page)
            now = db_now()
            finished: list[int] = []  # store clean-up after the outcomes committed
            for obj in page:
                row = rows.get(obj.key)
                if row is None:
                    continue
                if row.status == InboundEmail.Status.RECEIVED:
                    if row.next_attempt_at and row.next_attempt_at > now:
                        summary.outcomes["not_due"] += 1
                        continue
                    _handle(row.pk, store, summary, finished)
                elif row.status == InboundEmail.Status.AWAITING_RELAY:
                    summary.outcomes["awaiting_relay"] += 1
                else:
                    summary.outcomes["cleaned_up"] += 1  # handled before; still in the intake
                    finished.append(row.pk)
                if summary.handled >= limit:
                    summary.limit_reached = True
                    break
            inbound_email_finalize(ids=finished, store=store)
            if summary.limit_reached:
                break
        if not summary.limit_reached:
            _handle_unlisted(store, summary, listed_since=listed_since, limit=limit)
    except StoreError as exc:
        summary.list_error = str(exc)
        logger.error(
            "listing %s failed: %s",
            store.description,
            exc,
            extra={"action": "inbound_list_failed"},
        )
    requeued = reply_relay_sweep()
    if requeued:
        summary.outcomes["relay_requeued"] = requeued
    summary.seconds = time.monotonic() - started
    logger.info(
        "inbound poll: %s listed, %s handled in %.2fs %s",
        summary.listed,
        summary.handled,
        summary.seconds,
        dict(summary.outcomes),
        extra={"action": "inbound_poll", "sweep": "inbound_email"},
    )
    return summary


def _handle(
    inbound_email_id: int, store: MailStore, summary: PollSummary, finished: list[int]
) -> None:
    """Claim and handle one due row; count its outcome, and note it for the store clean-up."""
    doing(f"mail #{inbound_email_id}")  # the process registry's "current" (issue 20)
    try:
        outcome = inbound_email_handle(inbound_email_id=inbound_email_id, store=store)
    finally:
        doing("")
    if outcome is None:
        summary.outcomes["skipped"] += 1
        return
    summary.handled += 1
    summary.outcomes[outcome.label] += 1
    finished.append(inbound_email_id)


def _handle_unlisted(
    store: MailStore, summary: PollSummary, *, listed_since: datetime, limit: int
) -> None:
    """After a complete listing: due rows it did not show (their object was deleted by
    someone else) go through the same claim and handling, so they end visibly (quarantined
    `vanished`) rather than stay `received` where no poll looks (I6)."""
    ids = inbound_email_due_unlisted(listed_since=listed_since, limit=limit - summary.handled)
    finished: list[int] = []
    for inbound_email_id in ids:
        _handle(inbound_email_id, store, summary, finished)
    inbound_email_finalize(ids=finished, store=store)
