"""The new-proposal sweep under faults, sending through SES (moto, in the test process).

Three PIs with a proposal in review each: two on the `immediate` rung, one `paused` by the
missed-reply ladder. Recovery is the next cycle in a fresh process (after the sweep's
lease and the send claims have timed out, 1 s here; the pass itself claims for 60 s, so that
a loaded machine does not make it hand its claims back before the faulted round trip).
Invariants (I11, I12, I13):
- every notice the ladder allows is sent and recorded once; the paused PI gets none;
- none is marked sent without SES having accepted it (its message id is SES's);
- no notice is sent twice, except what I12 accepts: a pass killed between SES's acceptance
  and the record may cost one duplicate (SES has no idempotency key), never more;
- the ladder is unchanged by a new-proposal sweep (rungs and miss counts as set up).
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from model_bakery import baker
from moto.core import DEFAULT_ACCOUNT_ID
from moto.ses.models import ses_backends

from notifications.models import EmailNotification, NotificationPreference, Proposal
from notifications.sweeps import sweep_new_proposals
from tests.support.fault_harness import Scenario
from tests.support.ses import REGION, MotoSes

Rung = NotificationPreference.Rung
PIS = [("pi1", Rung.IMMEDIATE, 0), ("pi2", Rung.IMMEDIATE, 1), ("pi3", Rung.PAUSED, 0)]
RECOVERY_SECONDS = 20.0


class NewProposalSweep(Scenario):
    name = "sweeps"
    settings = {
        "EMAIL_SENDER": "ses",
        "SES_REGION": REGION,
        "NOTIFICATION_SEND_RATE": 1e6,
        "NOTIFICATION_SWEEP_LEASE_SECONDS": 1,
        "NOTIFICATION_CLAIM_TIMEOUT_SECONDS": 1,
        "NOTIFICATION_RETRY_BASE_SECONDS": 0,
    }
    # The pass sends within half its claim timeout from the batch's start: 0.5 s was missed
    # beside three busy xdist workers (the claims handed back, the record never reached).
    run_settings = {"NOTIFICATION_CLAIM_TIMEOUT_SECONDS": 60}

    def __init__(self) -> None:
        self.endpoint = ""  # moto's server, set by the test (tests/faults/conftest.py)

    def setup(self, workdir: Path) -> dict[str, Any]:
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        )
        import boto3

        ses = boto3.client(
            "ses",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        MotoSes(ses).verify_sender()  # the sender, and the envelope's bounce domain
        for username, rung, missed in PIS:
            user = baker.make(get_user_model(), username=username, email=f"{username}@example.org")
            baker.make(NotificationPreference, user=user, rung=rung, consecutive_missed=missed)
            baker.make(Proposal, pi=user, title=f"Soil carbon {username}", status="in_review")
        return {}

    def run(self, ctx: dict[str, Any]) -> None:
        sweep_new_proposals()

    def recover(self, ctx: dict[str, Any]) -> None:
        """The next cycles: until a cycle ran (not busy) with nothing left pending."""
        deadline = time.monotonic() + RECOVERY_SECONDS
        while time.monotonic() < deadline:
            summary = sweep_new_proposals()
            left = EmailNotification.objects.exclude(
                status__in=[EmailNotification.Status.SENT, EmailNotification.Status.FAILED]
            ).exists()
            if not summary.busy and not left:
                return
            time.sleep(0.3)

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        accepted = ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages
        sent_to = Counter(message.destinations[0] for message in accepted)
        accepted_ids = {message.id for message in accepted}
        rows = list(EmailNotification.objects.select_related("user"))
        recorded = {row.ses_message_id for row in rows if row.ses_message_id}
        unrecorded = len(accepted_ids - recorded)
        violations = []
        for username, rung, missed in PIS:
            address = f"{username}@example.org"
            mine = [row for row in rows if row.user.username == username]
            pref = NotificationPreference.objects.get(user__username=username)
            if (pref.rung, pref.consecutive_missed) != (rung, missed):
                violations.append(f"{username}: ladder {pref.rung}/{pref.consecutive_missed}")
            if rung == Rung.PAUSED:
                if sent_to[address] or any(row.status == "sent" for row in mine):
                    violations.append(f"{username} is paused but was mailed")
                continue
            sent = [row for row in mine if row.status == EmailNotification.Status.SENT]
            if len(sent) != 1:
                violations.append(f"{username}: {len(sent)} notices recorded sent")
            allowed = 1 + (killed_pid is not None and unrecorded == 1)
            if sent_to[address] > allowed:
                violations.append(f"{username}: mailed {sent_to[address]} times")
        for row in rows:
            if (
                row.status == EmailNotification.Status.SENT
                and row.ses_message_id not in accepted_ids
            ):
                violations.append(f"notification {row.pk} marked sent, SES never accepted it")
        if unrecorded > (1 if killed_pid is not None else 0):
            violations.append(f"{unrecorded} mails SES accepted are recorded nowhere")
        return violations


NEW_PROPOSAL_SWEEP = NewProposalSweep()
