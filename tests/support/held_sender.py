"""A mail service that holds each send until the test lets it go: a sweep's cycle caught
mid-delivery, its claims committed and its lease held, as a long cycle on another worker is."""

from __future__ import annotations

import threading
import uuid

from notifications.senders.base import MessageId, OutgoingEmail
from notifications.sweeps import SweepSummary, run_sweep


class HeldSender:
    def __init__(self) -> None:
        self.sending = threading.Event()  # a send has started (the cycle is mid-delivery)
        self.release = threading.Event()  # set by the test: every send goes through
        self.recipients: list[str] = []

    def send(self, email: OutgoingEmail) -> MessageId:
        self.sending.set()
        if not self.release.wait(timeout=60):
            raise TimeoutError("the test never released the held sender")
        self.recipients.append(email.to)
        return f"{uuid.uuid4().hex}@held.test"


class SweepInThread(threading.Thread):
    """`run_sweep(kind, sender=HeldSender)` on a thread (its own database connection), as
    another worker runs it; `summary` once it ends."""

    def __init__(self, kind: str, sender: HeldSender) -> None:
        super().__init__(name=f"other-worker-{kind}", daemon=True)
        self.kind, self.sender = kind, sender
        self.summary: SweepSummary | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        try:
            self.summary = run_sweep(self.kind, sender=self.sender)
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which re-raises it
            self.error = exc
        finally:
            connection.close()

    def finish(self) -> SweepSummary:
        self.sender.release.set()
        self.join(timeout=60)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the other worker's sweep did not end"
        return self.summary
