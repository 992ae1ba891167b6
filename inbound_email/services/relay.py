"""The instruction relay (an outbox through the jobs app): Slack, else the database inbox.

An accepted instruction waits as a pending `Reply` with its mail kept in the intake (status
awaiting_relay). Each job runs one attempt. Only once the instruction is posted or inboxed is
the notification marked responded and the mail processed, in the same transaction; the mail
leaves the intake after that commit (I8, COR-32). A handler that raises is rolled back and
could not count its own attempts, so `reply_relay` records failures on the Reply and enqueues
the next attempt itself (`run_after = now + max(backoff, Retry-After)`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from canonical_ids import record_message
from inbound_email.conf import get_config
from inbound_email.exceptions import SlackPostError
from inbound_email.models import InboundEmail, Reply
from inbound_email.services.ledger import backoff_seconds, reply_complete
from inbound_email.services.store_sync import inbound_email_finalize
from inbound_email.slack import escape_mrkdwn, post_message, slack_enabled
from inbound_email.stores import default_store
from jobs import enqueue

logger = logging.getLogger(__name__)

RELAY_JOB_KIND = "inbound_email.relay_reply"
RELAY_STALE_SECONDS = 900  # a pending relay this overdue lost its wake-up: enqueue it again
SLACK_TEXT_LIMIT = 3000  # characters of instruction in the Slack message (full text kept)


def reply_relay_enqueue(*, reply_id: int, run_after: datetime | None = None) -> None:
    """Queue one relay attempt in the caller's transaction (visible at its commit)."""
    options = {} if run_after is None else {"run_after": run_after}
    enqueue(RELAY_JOB_KIND, {"reply_id": reply_id}, **options)


def slack_text(reply: Reply) -> str:
    notification = reply.notification
    user = notification.user
    who = user.get_full_name() or user.get_username()
    title = (
        notification.proposal.title if notification.proposal else f"notification {notification.pk}"
    )
    instruction = reply.instruction
    if len(instruction) > SLACK_TEXT_LIMIT:
        instruction = (
            instruction[:SLACK_TEXT_LIMIT]
            + f"\n[… truncated; the full text is reply #{reply.pk} in the admin]"
        )
    return (
        f"Instruction by email reply from {escape_mrkdwn(who)} on "
        f"\u201c{escape_mrkdwn(title)}\u201d:\n{escape_mrkdwn(instruction)}"
    )


def reply_relay_sweep(*, stale_seconds: float = RELAY_STALE_SECONDS) -> int:
    """Re-enqueue relays whose wake-up was lost (e.g. a job that failed for an unexpected
    reason): pending replies whose next attempt is long overdue. Returns how many.

    A duplicate wake-up is harmless: the relay locks the reply and checks its status.
    """
    now = timezone.now()
    stale = now - timedelta(seconds=stale_seconds)
    with transaction.atomic():
        replies = list(
            Reply.objects.select_for_update(skip_locked=True)
            .filter(relay_status=Reply.RelayStatus.PENDING)
            .filter(
                Q(relay_next_attempt_at__lt=stale)
                | Q(relay_next_attempt_at__isnull=True, created_at__lt=stale)
            )
            .only("id")[:500]
        )
        for reply in replies:
            reply_relay_enqueue(reply_id=reply.pk)
        Reply.objects.filter(pk__in=[r.pk for r in replies]).update(relay_next_attempt_at=now)
    if replies:
        logger.warning(
            "re-enqueued %s overdue instruction relays",
            len(replies),
            extra={"action": "instruction_relay_requeued"},
        )
    return len(replies)


def reply_relay(*, reply_id: int) -> str:
    """One relay attempt of a pending instruction: "posted", "inboxed", "retry" or "skipped".

    Slack off: the instruction goes to the database inbox at once. Slack on: a failed post
    (no channel, API error, 429) is retried with backoff (at least Retry-After); when the
    budget is spent it goes to the database inbox with `needs_operator`. Only once it is
    posted or inboxed is the notification marked responded and the mail processed (and deleted
    from the intake).
    """
    now = timezone.now()
    with transaction.atomic():
        reply = (
            Reply.objects.select_for_update(of=("self",))
            .select_related("notification__user", "notification__proposal", "inbound_email")
            .filter(pk=reply_id)
            .first()
        )
        if reply is None or reply.relay_status != Reply.RelayStatus.PENDING:
            return "skipped"
        if reply.relay_next_attempt_at and reply.relay_next_attempt_at > now + timedelta(seconds=1):
            return "skipped"  # a duplicate wake-up before the scheduled retry
        reply.relay_attempts += 1
        if not slack_enabled():
            _inbox(reply, fallback_error="")
            outcome = "inboxed"
        else:
            proposal = reply.notification.proposal
            # The proposal's current channel: one configured after a failed attempt is used.
            reply.slack_channel = (
                proposal.slack_channel if proposal else ""
            ) or reply.slack_channel
            try:
                reply.slack_ts = post_message(channel=reply.slack_channel, text=slack_text(reply))
            except SlackPostError as exc:
                if reply.relay_attempts >= get_config().relay_max_attempts:
                    _inbox(reply, fallback_error=str(exc))
                    outcome = "inboxed"
                else:
                    _schedule_relay_retry(reply, exc, now)
                    return "retry"
            else:
                reply.relay_status = Reply.RelayStatus.POSTED
                outcome = "posted"
                logger.info(
                    "instruction of reply %s posted to Slack (attempt %s)",
                    reply.pk,
                    reply.relay_attempts,
                    extra={"action": "instruction_posted", "reply_id": reply.pk},
                )
        row = InboundEmail.objects.select_for_update().get(pk=reply.inbound_email_id)
        reply_complete(reply, row, now)
        # The mail leaves the intake only after the outcome commits (the job runner's
        # transaction when run as a job): a rollback keeps it, still awaiting_relay.
        inbound_email_id = reply.inbound_email_id
        transaction.on_commit(
            lambda: inbound_email_finalize(ids=[inbound_email_id], store=default_store()),
            robust=True,
        )
    return outcome


def _schedule_relay_retry(reply: Reply, exc: SlackPostError, now: datetime) -> None:
    config = get_config()
    delay = backoff_seconds(
        reply.relay_attempts,
        base=config.relay_backoff_base_seconds,
        cap=config.relay_backoff_cap_seconds,
    )
    if exc.retry_after is not None:
        delay = max(delay, exc.retry_after)
    reply.relay_next_attempt_at = now + timedelta(seconds=delay)
    reply.relay_last_error = str(exc)[:2000]
    reply.save(
        update_fields=[
            "relay_attempts",
            "relay_next_attempt_at",
            "relay_last_error",
            "slack_channel",
        ]
    )
    reply_relay_enqueue(reply_id=reply.pk, run_after=reply.relay_next_attempt_at)
    logger.warning(
        "instruction of reply %s not posted (attempt %s, retry in %.0fs): %s",
        reply.pk,
        reply.relay_attempts,
        delay,
        exc,
        extra={
            "action": "instruction_retry",
            "reply_id": reply.pk,
            "attempt": reply.relay_attempts,
        },
    )


def _inbox(reply: Reply, *, fallback_error: str) -> None:
    """Record the instruction in the database inbox (a Message with a minted canonical id)."""
    notification = reply.notification
    proposal = notification.proposal
    message = record_message(
        run_id=(proposal.run_id if proposal else "")[:64],
        text=reply.instruction,
        author=f"pi:{notification.user_id}",
        source="email",
        metadata={
            "reply_id": reply.pk,
            "notification_id": notification.pk,
            "inbound_email_id": reply.inbound_email_id,
            "rating": reply.rating,
            "slack_failed": bool(fallback_error),
        },
    )
    reply.message_ts = message.ts
    reply.relay_status = Reply.RelayStatus.INBOXED
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
