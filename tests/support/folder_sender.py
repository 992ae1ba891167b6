"""A notification sender for child processes that writes each accepted mail to its own file
(`<message id>.eml` in SENT_MAIL_DIR), so a test can count what left: one file per send.
Set EMAIL_SENDER=tests.support.folder_sender.FolderSender and SENT_MAIL_DIR in the child."""

from __future__ import annotations

import os
from pathlib import Path

from notifications.senders.base import MessageId, OutgoingEmail, build_message


class FolderSender:
    def __init__(self) -> None:
        self.folder = Path(os.environ["SENT_MAIL_DIR"])

    def send(self, email: OutgoingEmail) -> MessageId:
        message, message_id = build_message(email)
        partial = self.folder / f".{message_id}.tmp"
        partial.write_bytes(message.message().as_bytes())
        partial.rename(self.folder / f"{message_id}.eml")
        return message_id


def sent_message_ids(folder: Path) -> list[str]:
    return [path.name.removesuffix(".eml") for path in folder.glob("*.eml")]
