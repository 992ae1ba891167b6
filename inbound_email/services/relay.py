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

The attempt's parts: `relay_claim.py` (the claim), `relay_slack.py` (the Slack step),
`relay_record.py` (the outcome), `relay_inbox.py` (the database inbox), `relay_message.py`
(the text and metadata posted).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q

from inbound_email.conf import get_config
from inbound_email.models import Reply
from inbound_email.services.relay_claim import (
    RELAY_JOB_KIND,
    RelayClaim,
    RelayResult,
    reply_relay_claim,
    reply_relay_enqueue,
)
from inbound_email.services.relay_message import RELAY_EVENT_TYPE, relay_metadata
from inbound_email.services.relay_record import _relay_to_inbox, reply_relay_record
from inbound_email.slack_basics import slack_enabled
from project.db_clock import db_now

logger = logging.getLogger(__name__)

__all__ = [  # the names callers and tests import from here
    "RELAY_EVENT_TYPE",
    "RELAY_JOB_KIND",
    "RELAY_STALE_SECONDS",
    "RelayClaim",
    "RelayResult",
    "relay_metadata",
    "reply_relay",
    "reply_relay_claim",
    "reply_relay_enqueue",
    "reply_relay_record",
    "reply_relay_sweep",
]

RELAY_STALE_SECONDS = 900  # a pending relay this overdue lost its wake-up: enqueue it again


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
    # Imported here: the Slack step brings in slack-sdk, which a process that never relays
    # (most `manage.py` commands, the web app) should not pay for at start-up.
    from inbound_email.services.relay_slack import reply_relay_slack

    result = reply_relay_slack(claim)
    return reply_relay_record(claim=claim, result=result)
