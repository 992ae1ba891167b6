"""The text and metadata of a relayed instruction's Slack message (pure, no I/O).

The metadata is what the relay searches `conversations.history` for after an ambiguous post,
so the text and the identity of a post are decided in one place.
"""

from __future__ import annotations

from typing import Any

from inbound_email.models import Reply
from inbound_email.slack import escape_mrkdwn

RELAY_EVENT_TYPE = "pi_instruction"  # Slack message metadata of a relayed instruction
SLACK_TEXT_LIMIT = 3000  # characters of instruction in the Slack message (full text kept)


def relay_metadata(reply_id: int) -> dict[str, Any]:
    """The Slack message metadata that identifies the post of a reply's instruction."""
    return {"event_type": RELAY_EVENT_TYPE, "event_payload": {"reply_id": reply_id}}


def cut_text_note(reply: Reply) -> str:
    """A line telling the PI's team that text of the mail was not relayed ("" when none)."""
    n = reply.cut_lines
    if not n:
        return ""
    lines = "1 line" if n == 1 else f"{n} lines"
    verb = "was" if n == 1 else "were"
    return (
        f"[{lines} of quoted/trailing text {verb} not relayed; see reply #{reply.pk} in the admin]"
    )


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
    note = cut_text_note(reply)
    return (
        f"Instruction by email reply from {escape_mrkdwn(who)} on "
        f"\u201c{escape_mrkdwn(title)}\u201d:\n{escape_mrkdwn(instruction)}"
        + (f"\n{escape_mrkdwn(note)}" if note else "")
    )
