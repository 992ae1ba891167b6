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

Exactly once when Slack answers late (issue 21): a look-up can only say "not there yet". So
(1) every Slack call of an attempt is sent before the attempt's claim expires, or not at all
(its timeout is capped by what is left of the claim, `slack.call_timeout`); (2) a post whose
outcome is unknown is given until its claim plus two claim timeouts
(`relay_unsure_until`) to show up: a look-up before then that does not find it is waited
out, never followed by a new post or the inbox; (3) an attempt's record applies only while
its claim is still the current one (the attempt number is the fencing token), so a late
answer never overwrites a takeover. Claim times and their expiry are the database's clock,
not a host's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from canonical_ids import record_message
from inbound_email.conf import get_config
from inbound_email.exceptions import SlackLookupError, SlackPostError, StoreError
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.services.ledger import backoff_seconds, reply_complete
from inbound_email.services.relay_message import (
    RELAY_EVENT_TYPE,
    cut_text_note,
    files_comment,
    files_marker,
    relay_metadata,
    slack_text,
)
from inbound_email.services.store_sync import inbound_email_finalize
from inbound_email.slack import (
    find_message,
    find_thread_message,
    post_message,
    post_outcome_unknown,
    share_files,
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
    claim = reply_relay_claim(reply_id=reply_id)
    if claim is None:
        return "skipped"
    result = reply_relay_slack(claim)
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


def reply_relay_slack(claim: RelayClaim) -> RelayResult:
    """The Slack step of one claimed attempt; no database. Every failure becomes a
    RelayResult; no call is sent once the claim's deadline has passed."""
    if claim.message_ts:
        return _share_files(claim)
    if claim.unsure_since is not None:
        try:
            ts = find_message(
                channel=claim.channel,
                event_type=RELAY_EVENT_TYPE,
                event_payload=relay_metadata(claim.reply_id)["event_payload"],
                oldest=claim.unsure_since.timestamp() - RELAY_LOOKUP_MARGIN_SECONDS,
                max_pages=RELAY_LOOKUP_MAX_PAGES,
                deadline=claim.deadline,
            )
        except SlackLookupError as exc:
            return RelayResult("lookup_failed", error=str(exc), retry_after=exc.retry_after)
        if ts:
            return RelayResult("found", ts=ts)
        if claim.unsure_until is not None and claim.claimed_at < claim.unsure_until:
            # Not there *yet*: the unsure post may still be on its way. Neither a new post
            # nor the inbox before it has had its time (the look-up then decides).
            return RelayResult(
                "waiting",
                error=f"a post whose outcome is unknown may still show up in Slack until "
                f"{claim.unsure_until.isoformat()}: looked up again then",
            )
    if claim.attempt > get_config().relay_max_attempts:
        return RelayResult("spent")  # only look-ups were left: it is not in Slack
    try:
        ts = post_message(
            channel=claim.channel,
            text=claim.text,
            metadata=relay_metadata(claim.reply_id),
            deadline=claim.deadline,
        )
    except SlackPostError as exc:
        outcome = "unknown" if post_outcome_unknown(exc) else "refused"
        return RelayResult(outcome, error=str(exc), retry_after=exc.retry_after)
    return RelayResult("posted", ts=ts)


def _share_files(claim: RelayClaim) -> RelayResult:
    """The attachments' step, once the instruction is posted: shared in its thread with one
    files.completeUploadExternal, under the same claim / look-up / record rules as the post
    (the look-up searches the thread for the sharing message, which names the reply)."""
    if claim.unsure_since is not None:
        try:
            ts = find_thread_message(
                channel=claim.channel,
                thread_ts=claim.message_ts,
                marker=files_marker(claim.reply_id),
                max_pages=RELAY_LOOKUP_MAX_PAGES,
                deadline=claim.deadline,
            )
        except SlackLookupError as exc:
            return RelayResult("lookup_failed", error=str(exc), retry_after=exc.retry_after)
        if ts:
            return RelayResult("files_found", ts=ts)
        if claim.unsure_until is not None and claim.claimed_at < claim.unsure_until:
            return RelayResult(
                "waiting",
                error=f"attachments whose sharing is unconfirmed may still show up in Slack "
                f"until {claim.unsure_until.isoformat()}: looked up again then",
            )
    if not claim.files:
        return RelayResult("files_posted")  # nothing left to share (all relayed meanwhile)
    if claim.files_attempt > get_config().relay_max_attempts:
        return RelayResult("files_spent")
    try:
        store = default_store()
        files = [(name, store.get(key)) for name, key in claim.files]
    except StoreError as exc:
        return RelayResult("refused", error=f"reading a stored attachment failed: {exc}")
    try:
        ids = share_files(
            channel=claim.channel,
            thread_ts=claim.message_ts,
            files=files,
            comment=files_comment(claim.reply_id, len(files)),
            deadline=claim.deadline,
        )
    except SlackPostError as exc:
        outcome = "unknown" if post_outcome_unknown(exc) else "refused"
        return RelayResult(outcome, error=str(exc), retry_after=exc.retry_after)
    return RelayResult("files_posted", file_ids=tuple(ids))


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
