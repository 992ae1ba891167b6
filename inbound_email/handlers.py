"""Job handlers of the inbound_email app (autodiscovered by the jobs app)."""

from __future__ import annotations

from inbound_email.services.relay import RELAY_JOB_KIND, reply_relay
from jobs import handler


@handler(RELAY_JOB_KIND)
def relay_reply(payload: dict) -> None:
    """One relay attempt; the service schedules its own retries (honouring Retry-After)."""
    reply_relay(reply_id=int(payload["reply_id"]))
