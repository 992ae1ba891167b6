"""The Slack relay under faults: one reply's instruction relayed to the local Slack server.

Setup polls the intake in the test process (the reply is accepted, its relay job queued);
the faulted pass drains that job; recovery is what the next processes do: the reaper, the
relay sweep (claims left `posting`) and drains, until the instruction is posted or inboxed.
Invariant (I8): exactly one post in Slack or one entry in the database inbox, never both,
never none; the mail processed and the notification responded once that is durable.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.test.utils import override_settings

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.relay import reply_relay_sweep
from jobs import run_pending
from jobs.reaper import jobs_reap_stale
from notifications.models import EmailNotification
from tests.faults.intake_scenario import intake_settings, make_notification
from tests.faults.jobs_scenario import JobsDrain
from tests.support.fault_harness import Scenario
from tests.support.mail import build_mail
from tests.support.slack_server import SlackServer

RECOVERY_SECONDS = 30.0
FINAL = {Reply.RelayStatus.POSTED, Reply.RelayStatus.INBOXED}


class SlackRelay(Scenario):
    name = "relay"
    # The pass's Slack calls must leave within its claim timeout, measured from before the
    # claim: 1 s may be missed beside three busy xdist workers (the post never sent, the
    # faulted round trip never reached). Recovery keeps 1 s: it takes the claim over at once.
    run_settings = {"INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS": 60}

    def __init__(self) -> None:
        self._slack: SlackServer | None = None  # in the test process, one per run

    def setup(self, workdir: Path) -> dict[str, Any]:
        if self._slack is not None:
            self._slack.stop()
        self._slack = SlackServer().start()
        ctx = {"mail_dir": str(workdir / "mail"), "slack_url": self._slack.base_url}
        notification = make_notification("ada", "ada@university.example")
        with override_settings(**self.child_settings(ctx)):
            from inbound_email import stores

            stores._default_cache.clear()
            stores.store_from_url().put(
                "reply",
                build_mail(
                    token=notification.token,
                    sender="ada@university.example",
                    body="Please shorten the abstract.",
                ),
            )
            poll_once()
        reply = Reply.objects.get()
        assert reply.relay_status == Reply.RelayStatus.PENDING, reply.relay_status
        return {**ctx, "reply": reply.pk, "notification": notification.pk}

    def child_settings(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {
            **JobsDrain.settings,
            **intake_settings(ctx["mail_dir"]),
            "SLACK_BOT_TOKEN": "xoxb-test-token",
            "SLACK_API_URL": ctx["slack_url"],
            "SLACK_TIMEOUT": 5,
            "INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS": 1,
        }

    def run(self, ctx: dict[str, Any]) -> None:
        from inbound_email import stores

        stores._default_cache.clear()
        run_pending()

    def recover(self, ctx: dict[str, Any]) -> None:
        from inbound_email import stores

        stores._default_cache.clear()
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            jobs_reap_stale()
            reply_relay_sweep(stale_seconds=0)
            run_pending()
            reply = Reply.objects.get(pk=ctx["reply"])
            if reply.relay_status in FINAL:
                poll_once()  # the mail leaves the intake after the outcome committed
                return
            time.sleep(0.2)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        slack, self._slack = self._slack, None
        posts = len(slack.posts)
        slack.stop()
        inboxed = Message.objects.count()
        reply = Reply.objects.get(pk=ctx["reply"])
        violations = []
        if (posts, inboxed) not in ((1, 0), (0, 1)):
            violations.append(f"{posts} posts in Slack and {inboxed} inbox entries")
        if reply.relay_status not in FINAL:
            violations.append(f"the reply ended {reply.relay_status}")
        mail = InboundEmail.objects.get(pk=reply.inbound_email_id)
        if mail.status != InboundEmail.Status.PROCESSED:
            violations.append(f"the mail ended {mail.status}")
        notification = EmailNotification.objects.get(pk=ctx["notification"])
        if notification.status != EmailNotification.Status.RESPONDED:
            violations.append(f"the notification ended {notification.status}")
        return violations


SLACK_RELAY = SlackRelay()
