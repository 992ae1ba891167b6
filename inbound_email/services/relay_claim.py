"""A relay attempt's claim (see relay.py for the whole relay): what it holds, when a reply is
due, and the claim itself, which commits before any Slack call.

The claim sets status `posting`, counts the attempt and records the claim time on the
database's clock; the attempt number is the fencing token its record is checked against. A
claim left `posting` past INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS is taken over, its post marked
unsure and looked up before any new one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from inbound_email.conf import get_config
from inbound_email.models import Reply, ReplyAttachment
from inbound_email.services.relay_message import slack_text
from jobs import enqueue
from project.db_clock import db_now

logger = logging.getLogger(__name__)

RELAY_JOB_KIND = "inbound_email.relay_reply"
# An unconfirmed post is waited for until its claim + this many claim timeouts: its request
# was sent before the claim expired, and Slack gets one more claim timeout to show it.
RELAY_SETTLE_CLAIM_TIMEOUTS = 2


@dataclass(frozen=True)
class RelayClaim:
    """A claimed relay attempt: all the Slack step needs, so it runs without the database."""

    reply_id: int
    attempt: int
    claimed_at: datetime
    channel: str
    text: str
    unsure_since: datetime | None
    unsure_until: datetime | None = None  # an unsure post may still show up until then
    deadline: float | None = None  # time.monotonic() by which every call must be sent
    message_ts: str = ""  # the instruction is posted: this attempt shares the attachments
    files: tuple[tuple[str, str], ...] = ()  # (file name, store key) still to relay
    files_attempt: int = 0


@dataclass(frozen=True)
class RelayResult:
    """What the Slack step found out. `outcome`: posted | found (in the history, not posted
    again) | refused (Slack said no: not posted) | unknown (may have been posted) |
    lookup_failed | waiting (not in the history yet, but an unsure post may still show up) |
    spent (budget spent and not in the history: the inbox)."""

    outcome: str
    ts: str = ""
    error: str = ""
    retry_after: float | None = None
    file_ids: tuple[str, ...] = ()


def reply_relay_enqueue(*, reply_id: int, run_after: datetime | None = None) -> None:
    """Queue one relay attempt in the caller's transaction (visible at its commit)."""
    options = {} if run_after is None else {"run_after": run_after}
    enqueue(RELAY_JOB_KIND, {"reply_id": reply_id}, **options)


def _lock_reply(reply_id: int) -> Reply | None:
    return (
        Reply.objects.select_for_update(of=("self",))
        .select_related("notification__user", "notification__proposal")
        .filter(pk=reply_id)
        .first()
    )


def _due(reply: Reply, now: datetime) -> bool:
    """Whether an attempt may start: pending and due, or `posting` with an expired claim."""
    if reply.relay_status == Reply.RelayStatus.PENDING:
        # A duplicate wake-up before the scheduled retry is not due.
        return not (
            reply.relay_next_attempt_at and reply.relay_next_attempt_at > now + timedelta(seconds=1)
        )
    if reply.relay_status == Reply.RelayStatus.POSTING:
        # A live worker is posting it until its claim expires.
        timeout = timedelta(seconds=get_config().relay_claim_timeout_seconds)
        return reply.relay_claimed_at is None or reply.relay_claimed_at + timeout <= now
    return False


def _settles_at(claimed_at: datetime) -> datetime:
    """Until when a post sent under the claim of `claimed_at` may still show up in Slack."""
    timeout = get_config().relay_claim_timeout_seconds
    return claimed_at + timedelta(seconds=RELAY_SETTLE_CLAIM_TIMEOUTS * timeout)


def reply_relay_claim(*, reply_id: int, now: datetime | None = None) -> RelayClaim | None:
    """Claim one relay attempt and commit it: status `posting`, the attempt counted.

    None when the reply is not due (finished, scheduled later, or claimed by a live worker).
    A claim left `posting` past its timeout is taken over: its worker may have posted and
    died before recording, so the post is marked unsure and looked up before any new one.
    `now` is the database's clock unless given; the claim's Slack calls must be sent within
    the claim timeout, measured from before the claim (the claim's `deadline`).
    """
    deadline = time.monotonic() + get_config().relay_claim_timeout_seconds
    with transaction.atomic():
        now = now or db_now()
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return None
        if reply.relay_status == Reply.RelayStatus.POSTING:
            reply.relay_unsure_since = reply.relay_unsure_since or reply.relay_claimed_at
            reply.relay_unsure_until = max(
                filter(None, [reply.relay_unsure_until, _settles_at(reply.relay_claimed_at)])
            )
            logger.warning(
                "relay of reply %s was left posting since %s (attempt %s; the worker stopped "
                "between the post and its record?): looking it up before posting again",
                reply.pk,
                reply.relay_claimed_at,
                reply.relay_attempts,
                extra={"action": "instruction_claim_expired", "reply_id": reply.pk},
            )
        elif reply.relay_unsure_since is None and not reply.slack_ts:
            # The proposal's current channel: one configured after a failed attempt is used.
            # While a post is unsure it stays where that post may be (where the lookup runs).
            proposal = reply.notification.proposal
            reply.slack_channel = (
                proposal.slack_channel if proposal else ""
            ) or reply.slack_channel
        reply.relay_attempts += 1
        if reply.slack_ts:  # the instruction is posted: this attempt shares the attachments
            reply.relay_files_attempts += 1
        reply.relay_status = Reply.RelayStatus.POSTING
        reply.relay_claimed_at = now
        reply.save(
            update_fields=[
                "relay_attempts",
                "relay_files_attempts",
                "relay_status",
                "relay_claimed_at",
                "relay_unsure_since",
                "relay_unsure_until",
                "slack_channel",
            ]
        )
        # Built inside the claim's transaction: a failure here leaves no `posting` claim.
        return RelayClaim(
            reply_id=reply.pk,
            attempt=reply.relay_attempts,
            claimed_at=now,
            channel=reply.slack_channel,
            text=slack_text(reply),
            unsure_since=reply.relay_unsure_since,
            unsure_until=reply.relay_unsure_until,
            deadline=deadline,
            message_ts=reply.slack_ts,
            files=tuple(
                reply.attachments.filter(
                    state=ReplyAttachment.State.STORED, relayed_at__isnull=True
                ).values_list("filename", "store_key")
            ),
            files_attempt=reply.relay_files_attempts,
        )
