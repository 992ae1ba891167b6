"""The Slack step of a claimed relay attempt: no database, every failure a RelayResult, and no
call sent once the claim's deadline has passed. After an unknown outcome it looks the post
up (by its metadata, or the attachments' message in its thread) before posting again.
"""

from __future__ import annotations

from inbound_email.conf import get_config
from inbound_email.exceptions import SlackLookupError, SlackPostError, StoreError
from inbound_email.services.relay_claim import RelayClaim, RelayResult
from inbound_email.services.relay_message import (
    RELAY_EVENT_TYPE,
    files_comment,
    files_marker,
    relay_metadata,
)
from inbound_email.slack import (
    find_message,
    find_thread_message,
    post_message,
    post_outcome_unknown,
    share_files,
)
from inbound_email.stores import default_store

RELAY_LOOKUP_MARGIN_SECONDS = 120  # history searched from this long before the unsure claim
RELAY_LOOKUP_MAX_PAGES = 10  # of 200 messages; a longer history since then is a failed lookup


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
