"""The text and metadata of a relayed instruction's Slack message (pure, no I/O).

The metadata is what the relay searches `conversations.history` for after an ambiguous post,
so the text and the identity of a post are decided in one place.
"""

from __future__ import annotations

from typing import Any

from inbound_email.models import Reply, ReplyAttachment
from inbound_email.slack_basics import escape_mrkdwn

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


def files_comment(reply_id: int, count: int) -> str:
    """The message that shares a reply's attachments in its thread; it names the reply, which
    is what the look-up after an unknown outcome searches the thread for."""
    noun = "attachment" if count == 1 else "attachments"
    return f"{count} {noun} of the PI's email reply {files_marker(reply_id)}"


def files_marker(reply_id: int) -> str:
    return f"(reply #{reply_id})"


def _size(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB" if size >= 1024 * 1024 else f"{size} bytes"


def attachments_note(reply: Reply) -> str:
    """Lines about the reply's attachments for the relayed message ("" when none): how many
    follow in the thread, and each one kept only in the raw mail (too large, too many)."""
    rows = list(reply.attachments.all())
    lines = []
    stored = sum(1 for row in rows if row.state == ReplyAttachment.State.STORED)
    if stored:
        lines.append(f"[{stored} attachment{'s' if stored != 1 else ''} in the thread below]")
    for row in rows:
        if row.state != ReplyAttachment.State.STORED:
            lines.append(
                f"[attachment \u201c{row.filename}\u201d ({_size(row.size)}) "
                f"{row.get_state_display().lower()}: see reply #{reply.pk} in the admin]"
            )
    return "\n".join(lines)


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
    note = "\n".join(filter(None, [cut_text_note(reply), attachments_note(reply)]))
    return (
        f"Instruction by email reply from {escape_mrkdwn(who)} on "
        f"\u201c{escape_mrkdwn(title)}\u201d:\n{escape_mrkdwn(instruction)}"
        + (f"\n{escape_mrkdwn(note)}" if note else "")
    )
