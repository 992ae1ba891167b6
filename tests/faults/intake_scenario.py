"""The inbound poller under faults: one poll of a folder store, then the next poll.

The intake holds a reply with a rating and an instruction, a reply with a rating and a PDF
attached, a poison mail (5,000 header fields: past a parsing limit) and a DSN (Gmail's
hard bounce of a notification). Invariants (I6, I8, I22):
- no mail lost: every object ends as a row with an outcome, or is still in the intake;
- none processed twice: one Reply per mail and per notification, one attachment per file,
  one suppression, one relay job per instruction;
- a finished mail's object is gone from the intake once the next poll ran (quarantined:
  moved to the quarantine folder).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from model_bakery import baker

from inbound_email import stores
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.poller import poll_once
from jobs.models import Job
from notifications.models import DeliveryFeedback, EmailNotification, Proposal
from tests.support import delivery_reports
from tests.support.fault_harness import Scenario
from tests.support.mail import build_mail, with_attachments

Status = InboundEmail.Status
FINISHED = {Status.PROCESSED, Status.REJECTED, Status.QUARANTINED, Status.AWAITING_RELAY}
EXPECTED = {
    "reply": Status.AWAITING_RELAY,
    "attach": Status.AWAITING_RELAY,  # an attachment is relayed like an instruction
    "poison": Status.QUARANTINED,
    "dsn": Status.REJECTED,
}
BOUNCED = "gone.pi@example.net"


def intake_settings(mail_dir: str) -> dict[str, Any]:
    return {
        "SLACK_BOT_TOKEN": "",
        "INBOUND_EMAIL_STORE": mail_dir,
        "INBOUND_EMAIL_RETRY_BASE_SECONDS": 0,
        "INBOUND_RELAY_BACKOFF_BASE_SECONDS": 0,
        "MAX_REPLIES_PER_TOKEN_PER_HOUR": 5,
        "INBOUND_EMAIL_MAX_ATTEMPTS": 3,
    }


def make_notification(username: str, address: str) -> EmailNotification:
    user = baker.make(get_user_model(), username=username, email=address, first_name="Ada")
    proposal = baker.make(
        Proposal, pi=user, title="Soil carbon", run_id=f"run-{username}", slack_channel="C0P"
    )
    now = timezone.now()
    return baker.make(
        EmailNotification,
        user=user,
        proposal=proposal,
        kind=EmailNotification.Kind.PROPOSAL_REVIEW,
        status=EmailNotification.Status.SENT,
        to_address=address,
        sent_at=now - timedelta(hours=1),
        ses_message_id=f"ses-{username}",
        expires_at=now + timedelta(days=7),
    )


class IntakePoll(Scenario):
    name = "intake"

    def setup(self, workdir: Path) -> dict[str, Any]:
        mail_dir = workdir / "mail"
        self._store(str(mail_dir))
        store = stores.store_from_url(str(mail_dir))
        first = make_notification("ada", "ada@university.example")
        second = make_notification("grace", "grace@university.example")
        gone = make_notification("gone", BOUNCED)
        store.put(
            "reply",
            build_mail(
                token=first.token,
                sender="ada@university.example",
                body="4\nPlease tighten the budget section.",
            ),
        )
        store.put(
            "attach",
            build_mail(
                token=second.token,
                sender="grace@university.example",
                body="5",
                attach=with_attachments(),
            ),
        )
        head = b"From: x@university.example\r\nTo: replies@reply.localhost\r\n"
        store.put("poison", head + b"X-Filler: x\r\n" * 5_000 + b"\r\nhi\r\n")
        store.put("dsn", delivery_reports.gmail_hard_bounce(BOUNCED, gone.token))
        return {"mail_dir": str(mail_dir), "notifications": [first.pk, second.pk]}

    def child_settings(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return intake_settings(ctx["mail_dir"])

    def run(self, ctx: dict[str, Any]) -> None:
        poll_once()

    def recover(self, ctx: dict[str, Any]) -> None:
        poll_once()

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        store = self._store(ctx["mail_dir"])
        in_intake = {obj.key for page in store.list() for obj in page}
        rows = {row.store_key: row for row in InboundEmail.objects.all()}
        violations = []
        for key, want in EXPECTED.items():
            row = rows.get(key)
            if row is None or row.status == Status.RECEIVED:
                if key not in in_intake:
                    violations.append(f"{key}: lost (no outcome and not in the intake)")
                continue
            if row.status != want:
                violations.append(f"{key}: {row.status} ({row.reason}), not {want}")
            if row.status in FINISHED - {Status.AWAITING_RELAY} and key in in_intake:
                violations.append(f"{key}: {row.status} but still in the intake after a poll")
        replies = Counter(Reply.objects.values_list("notification_id", flat=True))
        for notification, count in replies.items():
            if count > 1:
                violations.append(f"notification {notification}: {count} replies recorded")
        names = Counter(ReplyAttachment.objects.values_list("reply_id", "filename"))
        violations += [f"attachment {name} stored {n} times" for name, n in names.items() if n > 1]
        reports = DeliveryFeedback.objects.filter(address=BOUNCED).count()
        if reports > 1:
            violations.append(f"the bounce was recorded {reports} times")
        relays = Counter(
            payload.get("reply_id")
            for payload in Job.objects.filter(kind__contains="relay").values_list(
                "payload", flat=True
            )
        )
        violations += [f"reply {r}: {n} relay jobs" for r, n in relays.items() if n > 1]
        return violations

    @staticmethod
    def _store(mail_dir: str):
        stores._default_cache.clear()
        return stores.store_from_url(mail_dir)


INTAKE_POLL = IntakePoll()
