"""What a worker's start says of the per-kind settings it wrote from code (caps, issue 37;
rates, issue 38): one log record and one start-up line, the same shape for each, so an
operator reads "job caps: …" and "job rates: …" alike."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence


def log_sync(
    logger: logging.Logger, noun: str, settings: Mapping[str, object], changes: Sequence[object]
) -> None:
    """Log on the sync's own logger what it changed (INFO, action `job_<noun>_changed`) or
    that it changed nothing (DEBUG). `noun` is the plural: "caps", "rates"."""
    summary = listed(settings)
    if changes:
        logger.info(
            "job %s changed: %s (%s now: %s)",
            noun,
            "; ".join(str(change) for change in changes),
            noun,
            summary,
            extra={"action": f"job_{noun}_changed", "changes": [str(c) for c in changes]},
        )
    else:
        logger.debug(
            "job %s unchanged: %s", noun, summary, extra={"action": f"job_{noun}_unchanged"}
        )


def start_line(noun: str, settings: Mapping[str, object], changes: Sequence[object]) -> str:
    """The start-up line of a worker command (beside the schedules')."""
    if not changes:
        return f"job {noun}: {listed(settings)} (unchanged)"
    return f"job {noun}: {listed(settings)} (changed: {'; '.join(str(c) for c in changes)})"


def listed(settings: Mapping[str, object]) -> str:
    return ", ".join(f"{kind} {value}" for kind, value in settings.items()) or "none"
