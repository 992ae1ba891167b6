"""Job handlers of the inbound_email app (autodiscovered by the jobs app)."""

from __future__ import annotations

from inbound_email.services.relay import RELAY_JOB_KIND, reply_relay
from jobs import handler


@handler(RELAY_JOB_KIND, atomic=False)
def relay_reply(payload: dict) -> None:
    """One relay attempt; the service schedules its own retries (honouring Retry-After).

    Outside the job's transaction (atomic=False): the relay commits its claim before the
    Slack post and records the outcome in its own transaction, so a database error after a
    post cannot roll the claim back and post again.
    """
    reply_relay(reply_id=int(payload["reply_id"]))
