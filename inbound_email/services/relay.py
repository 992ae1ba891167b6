"""The instruction relay (an outbox through the jobs app): Slack, else the database inbox.

An accepted instruction waits as a pending `Reply` with its mail kept in the intake (status
awaiting_relay). Each job runs one attempt. Only once the instruction is posted or inboxed is
the notification marked responded and the mail processed, in the same transaction as that
outcome; the mail leaves the intake after that commit (I8, COR-32). `reply_relay` records
failures on the Reply and enqueues the next attempt itself
(`run_after = now + max(backoff, Retry-After)`).

One attempt is claim -> commit -> Slack -> record, the notification sweeps' pattern: the
claim (status `posting`, the attempt counted, the claim time) commits before any Slack call
(the job handler runs outside the job's transaction, `atomic=False`), and the outcome is
recorded in a transaction of its own, so no rollback can undo the record of a post Slack
accepted and no retry repeats it. A post whose outcome is unknown (timeout, 5xx, reset
connection, or a claim left `posting` by a crash) sets `relay_unsure_since`; from then on each
attempt first searches the channel's history for the message by its metadata and records it
as posted when it is there, before it posts again or falls back to the inbox (I8: posted
once, inboxed, or pending; never dropped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from canonical_ids import record_message
from inbound_email.conf import get_config
from inbound_email.exceptions import SlackLookupError, SlackPostError
from inbound_email.models import InboundEmail, Reply
from inbound_email.services.ledger import backoff_seconds, reply_complete
from inbound_email.services.relay_message import (
    RELAY_EVENT_TYPE,
    cut_text_note,
    relay_metadata,
    slack_text,
)
from inbound_email.services.store_sync import inbound_email_finalize
from inbound_email.slack import (
    find_message,
    post_message,
    post_outcome_unknown,
    slack_enabled,
)
from inbound_email.stores import default_store
from jobs import enqueue
from project.db_clock import db_now

logger = logging.getLogger(__name__)

RELAY_JOB_KIND = "inbound_email.relay_reply"
RELAY_STALE_SECONDS = 900  # a pending relay this overdue lost its wake-up: enqueue it again


RELAY_LOOKUP_MARGIN_SECONDS = 120  # history searched from this long before the unsure claim
RELAY_LOOKUP_MAX_PAGES = 10  # of 200 messages; a longer history since then is a failed lookup


@dataclass(frozen=True)
class RelayClaim:
    """A claimed relay attempt: all the Slack step needs, so it runs without the database."""

    reply_id: int
    attempt: int
    claimed_at: datetime
    channel: str
    text: str
    unsure_since: datetime | None


@dataclass(frozen=True)
class RelayResult:
    """What the Slack step found out. `outcome`: posted | found (in the history, not posted
    again) | refused (Slack said no: not posted) | unknown (may have been posted) |
    lookup_failed | spent (budget spent and not in the history: the inbox)."""

    outcome: str
    ts: str = ""
    error: str = ""
    retry_after: float | None = None


def reply_relay_enqueue(*, reply_id: int, run_after: datetime | None = None) -> None:
    """Queue one relay attempt in the caller's transaction (visible at its commit)."""
    options = {} if run_after is None else {"run_after": run_after}
    enqueue(RELAY_JOB_KIND, {"reply_id": reply_id}, **options)


def reply_relay_sweep(*, stale_seconds: float = RELAY_STALE_SECONDS) -> int:
    """Re-enqueue relays whose wake-up was lost (e.g. a job that failed for an unexpected
    reason): pending replies whose next attempt is long overdue, and claims left `posting`
    past INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS (a worker died between the post and its record).
    Returns how many.

    A duplicate wake-up is harmless: the relay locks the reply and checks its status.
    """
    now = db_now()
    stale = now - timedelta(seconds=stale_seconds)
    claim_expired = now - timedelta(seconds=get_config().relay_claim_timeout_seconds)
    with transaction.atomic():
        replies = list(
            Reply.objects.select_for_update(skip_locked=True)
            .filter(
                Q(
                    relay_status=Reply.RelayStatus.PENDING,
                    relay_next_attempt_at__lt=stale,
                )
                | Q(
                    relay_status=Reply.RelayStatus.PENDING,
                    relay_next_attempt_at__isnull=True,
                    created_at__lt=stale,
                )
                | (
                    Q(relay_status=Reply.RelayStatus.POSTING, relay_claimed_at__lt=claim_expired)
                    & (
                        Q(relay_next_attempt_at__isnull=True)
                        | Q(relay_next_attempt_at__lt=claim_expired)
                    )
                )
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
    """One relay attempt of an instruction: "posted", "inboxed", "retry" or "skipped".

    Call it outside any transaction (the job handler is registered atomic=False): the claim
    must commit before Slack is called. Slack off: the instruction goes to the database inbox
    at once. Slack on: claim -> post (or look up first, after an unknown outcome) -> record.
    A refused post (no channel, API error, 429) is retried with backoff (at least
    Retry-After) and, when the budget is spent, goes to the database inbox with
    `needs_operator`. Only once it is posted or inboxed is the notification marked responded
    and the mail processed (and deleted from the intake).
    """
    if not slack_enabled():
        return _relay_to_inbox(reply_id=reply_id, now=db_now())
    claim = reply_relay_claim(reply_id=reply_id, now=db_now())
    if claim is None:
        return "skipped"
    result = _relay_to_slack(claim)
    return reply_relay_record(claim=claim, result=result)


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


def reply_relay_claim(*, reply_id: int, now: datetime) -> RelayClaim | None:
    """Claim one relay attempt and commit it: status `posting`, the attempt counted.

    None when the reply is not due (finished, scheduled later, or claimed by a live worker).
    A claim left `posting` past its timeout is taken over: its worker may have posted and
    died before recording, so the post is marked unsure and looked up before any new one.
    """
    with transaction.atomic():
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return None
        if reply.relay_status == Reply.RelayStatus.POSTING:
            reply.relay_unsure_since = reply.relay_unsure_since or reply.relay_claimed_at
            logger.warning(
                "relay of reply %s was left posting since %s (attempt %s; the worker stopped "
                "between the post and its record?): looking it up before posting again",
                reply.pk,
                reply.relay_claimed_at,
                reply.relay_attempts,
                extra={"action": "instruction_claim_expired", "reply_id": reply.pk},
            )
        elif reply.relay_unsure_since is None:
            # The proposal's current channel: one configured after a failed attempt is used.
            # While a post is unsure it stays where that post may be (where the lookup runs).
            proposal = reply.notification.proposal
            reply.slack_channel = (
                proposal.slack_channel if proposal else ""
            ) or reply.slack_channel
        reply.relay_attempts += 1
        reply.relay_status = Reply.RelayStatus.POSTING
        reply.relay_claimed_at = now
        reply.save(
            update_fields=[
                "relay_attempts",
                "relay_status",
                "relay_claimed_at",
                "relay_unsure_since",
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
        )


def _relay_to_slack(claim: RelayClaim) -> RelayResult:
    """The Slack step of one attempt; no database. Every failure becomes a RelayResult."""
    if claim.unsure_since is not None:
        try:
            ts = find_message(
                channel=claim.channel,
                event_type=RELAY_EVENT_TYPE,
                event_payload=relay_metadata(claim.reply_id)["event_payload"],
                oldest=claim.unsure_since.timestamp() - RELAY_LOOKUP_MARGIN_SECONDS,
                max_pages=RELAY_LOOKUP_MAX_PAGES,
            )
        except SlackLookupError as exc:
            return RelayResult("lookup_failed", error=str(exc), retry_after=exc.retry_after)
        if ts:
            return RelayResult("found", ts=ts)
    if claim.attempt > get_config().relay_max_attempts:
        return RelayResult("spent")  # only look-ups were left: it is not in Slack
    try:
        ts = post_message(
            channel=claim.channel, text=claim.text, metadata=relay_metadata(claim.reply_id)
        )
    except SlackPostError as exc:
        outcome = "unknown" if post_outcome_unknown(exc) else "refused"
        return RelayResult(outcome, error=str(exc), retry_after=exc.retry_after)
    return RelayResult("posted", ts=ts)


def reply_relay_record(*, claim: RelayClaim, result: RelayResult) -> str:
    """Record the outcome of a claimed attempt in its own transaction; returns reply_relay's
    outcome. A claim that is no longer ours (taken over after its timeout) is left alone."""
    now = db_now()
    budget = get_config().relay_max_attempts
    with transaction.atomic():
        reply = _lock_reply(claim.reply_id)
        if (
            reply is None
            or reply.relay_status != Reply.RelayStatus.POSTING
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
        if result.outcome in ("posted", "found"):
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
        else:  # refused with budget left, unknown, lookup_failed: try again later
            if result.outcome == "unknown":
                reply.relay_unsure_since = reply.relay_unsure_since or claim.claimed_at
            error = result.error
            if result.outcome == "lookup_failed":
                error = f"unsure whether an earlier post arrived; {error}"
            _schedule_relay_retry(reply, error=error, retry_after=result.retry_after, now=now)
            return "retry"
        _complete_and_release_mail(reply, now)
    return outcome


def _relay_to_inbox(*, reply_id: int, now: datetime) -> str:
    """Slack off: the database inbox at once, in one transaction (no external effect)."""
    with transaction.atomic():
        reply = _lock_reply(reply_id)
        if reply is None or not _due(reply, now):
            return "skipped"
        reply.relay_attempts += 1
        unsure = reply.relay_unsure_since is not None or reply.relay_status == "posting"
        _inbox(
            reply,
            fallback_error="Slack was turned off while a post of it was unconfirmed: it may "
            "be in Slack too"
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
    reply: Reply, *, error: str, retry_after: float | None, now: datetime
) -> None:
    config = get_config()
    delay = backoff_seconds(
        reply.relay_attempts,
        base=config.relay_backoff_base_seconds,
        cap=config.relay_backoff_cap_seconds,
    )
    if retry_after is not None:
        delay = max(delay, retry_after)
    reply.relay_status = Reply.RelayStatus.PENDING
    reply.relay_next_attempt_at = now + timedelta(seconds=delay)
    reply.relay_last_error = error[:2000]
    reply.save(
        update_fields=[
            "relay_status",
            "relay_unsure_since",
            "relay_next_attempt_at",
            "relay_last_error",
        ]
    )
    reply_relay_enqueue(reply_id=reply.pk, run_after=reply.relay_next_attempt_at)
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


def _inbox(reply: Reply, *, fallback_error: str) -> None:
    """Record the instruction in the database inbox (a Message with a minted canonical id)."""
    notification = reply.notification
    proposal = notification.proposal
    note = cut_text_note(reply)
    message = record_message(
        run_id=(proposal.run_id if proposal else "")[:64],
        text=reply.instruction + (f"\n{note}" if note else ""),
        author=f"pi:{notification.user_id}",
        source="email",
        metadata={
            "reply_id": reply.pk,
            "notification_id": notification.pk,
            "inbound_email_id": reply.inbound_email_id,
            "rating": reply.rating,
            "slack_failed": bool(fallback_error),
            "cut_lines": reply.cut_lines,
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
