"""Functions the qcluster schedules call (paths in ops/schedules.py)."""

from __future__ import annotations

from inbound_email.poller import poll_once
from inbound_email.services.retention import inbound_email_prune


def poll_inbound_email() -> dict:
    """One bounded poll of the intake; the summary is stored as the task's result."""
    return poll_once().as_dict()


def prune_inbound_email() -> int:
    """Delete finished mail rows past INBOUND_RETENTION_DAYS (quarantined mail never)."""
    return inbound_email_prune()
