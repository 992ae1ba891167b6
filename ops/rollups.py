"""The rollup of the append-only counter deltas (issue 32: no hot rows).

The triggers on jobs_job, inbound mail, notifications and replies append one delta row per
statement (jobs.models.JobCountDelta, ops.models.MetricDelta, ops.models.JobPeriodDelta)
instead of updating a shared counter row in place: a snapshot held for minutes by another
session would otherwise pile hundreds of thousands of versions on those rows, and every
enqueue would walk them. The qcluster's ticker (every OPS_ROLLUP_SECONDS, 5 s; ops/
rollup_ticker.py) and the schedule "ops: roll up counters" (every minute, for a cluster
started otherwise) fold the deltas into the rolled-up tables, one transaction per table
family, so the deltas stay few and the rolled-up rows gain a version per rollup. Readers
sum both in one statement: the figures are exact whether or not the rollup ran.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

logger = logging.getLogger(__name__)


def counters_roll_up(*, log_level: int = logging.INFO) -> int:
    """Fold every committed delta into the rolled-up tables; return how many deltas moved.

    Each SQL function takes its own transaction-level advisory lock, so two rollups at once
    (a schedule run twice, an operator's run, two clusters' tickers) take turns and move
    each delta once. The qcluster's ticker (ops/rollup_ticker.py) rolls up every few
    seconds and logs its rollups at DEBUG: twelve INFO lines a minute would say nothing.
    """
    moved = 0
    for function in ("jobs_count_rollup", "ops_series_rollup"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SELECT {function}()")
            moved += cursor.fetchone()[0]
    if moved:
        logger.log(
            log_level,
            "rolled up %s counter deltas",
            moved,
            extra={"action": "counters_rolled_up", "moved": moved},
        )
    return moved
