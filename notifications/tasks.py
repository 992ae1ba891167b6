"""The functions the qcluster schedules call (paths in ops/schedules.py). They hold no logic."""

from __future__ import annotations

from typing import Any

from notifications import notices, sweeps


def new_proposal_sweep() -> dict[str, Any]:
    return sweeps.sweep_new_proposals().as_dict()


def proposal_review_sweep() -> dict[str, Any]:
    return sweeps.sweep_proposal_reviews().as_dict()


def digest_sweep() -> dict[str, Any]:
    return sweeps.sweep_digests().as_dict()


def reply_rejected_notices() -> dict[str, Any]:
    return notices.notices_send().as_dict()
