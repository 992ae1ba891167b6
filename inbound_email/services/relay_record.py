"""Recording a relay attempt's outcome, each in a transaction of its own: posted (then the
attachments, in its thread), inboxed, or the next attempt scheduled. Only once the
instruction is posted or inboxed is the notification marked responded and the mail
processed, in that transaction; the mail leaves the intake after its commit.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction

from inbound_email.conf import get_config
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.services.ledger import backoff_seconds, reply_complete
from inbound_email.services.relay_claim import (
    RelayClaim,
    RelayResult,
    _due,
    _lock_reply,
    _settles_at,
    reply_relay_enqueue,
)
from inbound_email.services.relay_inbox import _inbox
from inbound_email.services.store_sync import inbound_email_finalize
from inbound_email.stores import default_store
from project.db_clock import db_now

logger = logging.getLogger(__name__)


def reply_relay_record(*, claim: RelayClaim, result: RelayResult) -> str:
    """Record the outcome of a claimed attempt in its own transaction; returns reply_relay's
    outcome. A claim that is no longer ours (taken over after its timeout) is left alone:
    the attempt number is the fencing token, so a late answer never overwrites a takeover."""
    budget = get_config().relay_max_attempts
    with transaction.atomic():
        now = db_now()
        reply = _lock_reply(claim.reply_id)
        if (
            reply is None
            or reply.relay_status != Reply.RelayStatus.POSTING
            or reply.relay_attempts != claim.attempt
            or reply.relay_claimed_at != claim.claimed_at
        ):
            logger.warning(
                "relay of reply %s: the claim of attempt %s was taken over before its outcome "
                "(%s) was recorded; the new claim looks it up",
                claim.reply_id,
                claim.attempt,
                result.outcome,
                extra={"action": "instruction_claim_lost", "reply_id": claim.reply_id},
            )
            return "skipped"
        if claim.message_ts and result.outcome in ("files_posted", "files_found", "files_spent"):
            _record_files(reply, claim, result, now)
            outcome = "posted"
        elif claim.message_ts and result.outcome == "refused" and claim.files_attempt >= budget:
            _record_files(reply, claim, RelayResult("files_spent", error=result.error), now)
            outcome = "posted"
        elif claim.message_ts:  # the attachments' step, budget left: try again later
            return _record_retry(reply, claim, result, now)
        elif result.outcome in ("posted", "found") and claim.files:
            # The instruction is in Slack; its attachments go to its thread next, at once.
            reply.slack_ts = result.ts
            reply.relay_unsure_since = reply.relay_unsure_until = None
            _schedule_relay_retry(reply, error="", retry_after=None, now=now, at_once=True)
            return "retry"
        elif result.outcome in ("posted", "found"):
            reply.slack_ts = result.ts
            reply.relay_status = Reply.RelayStatus.POSTED
            outcome = "posted"
            logger.info(
                "instruction of reply %s %s (attempt %s)",
                reply.pk,
                "posted to Slack"
                if result.outcome == "posted"
                else "found in the Slack channel's history: recorded as posted, not posted again",
                reply.relay_attempts,
                extra={"action": f"instruction_{result.outcome}", "reply_id": reply.pk},
            )
        elif result.outcome == "spent" or (result.outcome == "refused" and claim.attempt >= budget):
            _inbox(reply, fallback_error=result.error or reply.relay_last_error or "not posted")
            outcome = "inboxed"
        else:  # refused with budget left, unknown, lookup_failed, waiting: try again later
            return _record_retry(reply, claim, result, now)
        _complete_and_release_mail(reply, now)
    return outcome


def _record_retry(reply: Reply, claim: RelayClaim, result: RelayResult, now: datetime) -> str:
    """Refused with budget left, unknown, look-up failed or waiting: the next attempt is
    scheduled; after an unknown outcome not before the post (or share) had its time."""
    not_before = None
    if result.outcome == "unknown":
        reply.relay_unsure_since = reply.relay_unsure_since or claim.claimed_at
        reply.relay_unsure_until = max(
            filter(None, [reply.relay_unsure_until, _settles_at(claim.claimed_at)])
        )
        not_before = reply.relay_unsure_until  # the look-up then decides
    elif result.outcome == "waiting":
        not_before = reply.relay_unsure_until
    error = result.error
    if result.outcome == "lookup_failed":
        error = f"unsure whether an earlier post arrived; {error}"
    _schedule_relay_retry(
        reply, error=error, retry_after=result.retry_after, now=now, not_before=not_before
    )
    return "retry"


def _record_files(reply: Reply, claim: RelayClaim, result: RelayResult, now: datetime) -> None:
    """The attachments' outcome: shared (file ids kept when Slack gave them) or, with their
    budget spent, left for an operator (downloadable in the admin; the raw mail is kept)."""
    reply.relay_status = Reply.RelayStatus.POSTED
    pending = list(
        reply.attachments.filter(state=ReplyAttachment.State.STORED, relayed_at__isnull=True)
    )
    if result.outcome == "files_spent":
        reply.needs_operator = True
        reply.relay_last_error = (
            f"the instruction is in Slack but its {len(pending)} attachment(s) were never "
            f"shared in its thread ({result.error or reply.relay_last_error or 'not shared'}); "
            "download them in the admin"
        )[:2000]
        logger.error(
            "attachments of reply %s never reached Slack after %s attempts: left for an operator",
            reply.pk,
            claim.files_attempt,
            extra={"action": "attachments_not_shared", "reply_id": reply.pk},
        )
        return
    ids = list(result.file_ids) if len(result.file_ids) == len(pending) else []
    for position, attachment in enumerate(pending):
        attachment.relayed_at = now
        attachment.slack_file_id = ids[position] if ids else ""
    ReplyAttachment.objects.bulk_update(pending, ["relayed_at", "slack_file_id"])
    logger.info(
        "attachments of reply %s %s (%s files)",
        reply.pk,
        "shared in the instruction's Slack thread"
        if result.outcome == "files_posted"
        else "found in the instruction's Slack thread: recorded, not shared again",
        len(pending),
        extra={"action": f"attachments_{result.outcome}", "reply_id": reply.pk},
    )


def _relay_to_inbox(*, reply_id: int, now: datetime) -> str:
    """Slack off: the database inbox at once, in one transaction (no external effect)."""
    with transaction.atomic():
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return "skipped"
        reply.relay_attempts += 1
        unsure = reply.relay_unsure_since is not None or reply.relay_status == "posting"
        if reply.slack_ts:
            # The instruction is in Slack already; only its attachments were left to share.
            _inbox(
                reply,
                fallback_error="Slack was turned off before the attachments were shared in "
                "the instruction's thread: listed in the inbox"
                + ("; they may be in Slack too" if unsure else ""),
                attachments_only=True,
            )
        else:
            _inbox(
                reply,
                fallback_error="Slack was turned off while a post of it was unconfirmed: it "
                "may be in Slack too"
                if unsure
                else "",
            )
        _complete_and_release_mail(reply, now)
    return "inboxed"


def _complete_and_release_mail(reply: Reply, now: datetime) -> None:
    """The instruction is handled durably: the reply counts and its mail is processed. The
    mail leaves the intake only after this transaction commits (never before: a rollback
    would leave the row awaiting relay with its mail gone)."""
    row = InboundEmail.objects.select_for_update().get(pk=reply.inbound_email_id)
    reply_complete(reply, row, now)
    inbound_email_id = reply.inbound_email_id
    transaction.on_commit(
        lambda: inbound_email_finalize(ids=[inbound_email_id], store=default_store()),
        robust=True,
    )


def _schedule_relay_retry(
    reply: Reply,
    *,
    error: str,
    retry_after: float | None,
    now: datetime,
    not_before: datetime | None = None,
    at_once: bool = False,
) -> None:
    config = get_config()
    delay = (
        0.0
        if at_once
        else backoff_seconds(
            reply.relay_attempts,
            base=config.relay_backoff_base_seconds,
            cap=config.relay_backoff_cap_seconds,
        )
    )
    if retry_after is not None:
        delay = max(delay, retry_after)
    if not_before is not None:
        delay = max(delay, (not_before - now).total_seconds())
    reply.relay_status = Reply.RelayStatus.PENDING
    reply.relay_next_attempt_at = now + timedelta(seconds=delay)
    reply.relay_last_error = error[:2000]
    reply.save(
        update_fields=[
            "relay_status",
            "relay_unsure_since",
            "relay_unsure_until",
            "relay_next_attempt_at",
            "relay_last_error",
            "slack_ts",
        ]
    )
    reply_relay_enqueue(reply_id=reply.pk, run_after=reply.relay_next_attempt_at)
    if at_once:
        return
    spent = reply.relay_attempts >= config.relay_max_attempts
    (logger.error if spent else logger.warning)(
        "instruction of reply %s not posted (attempt %s%s, retry in %.0fs): %s",
        reply.pk,
        reply.relay_attempts,
        "; budget spent, Slack's answer unknown: looked up before the inbox" if spent else "",
        delay,
        error,
        extra={
            "action": "instruction_retry",
            "reply_id": reply.pk,
            "attempt": reply.relay_attempts,
        },
    )
