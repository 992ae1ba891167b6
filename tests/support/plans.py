"""The buffers a statement on the claim's path touches, read from its plan: how the tests
show that a scan reads the few index pages it should and not the rows beside them (a paused
backlog, the dead entries a pinned snapshot keeps)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.db import connection

from jobs.runner_step import Step, job_runner_step

_PAST_EVERY_ROW = datetime(9999, 12, 1, tzinfo=UTC)


def buffers(plans: list[str]) -> int:
    """The most buffers any one plan node of these plans touched (a node's count includes
    its children's)."""
    counts = [
        sum(int(n or 0) for n in match)
        for plan in plans
        for match in re.findall(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?", plan)
    ]
    return max(counts, default=0)


def explained(sql: str, params: list | None = None) -> int:
    """The buffers the statement's execution touched (not its planning's catalog reads)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params or [])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return buffers([plan.split("\nPlanning:")[0]])


def runner_step_buffers(*, floor: datetime | None, claim: int = 5) -> tuple[int, Step, list[str]]:
    """The buffers of the runner's claim with this floor (None: a full scan), from its
    nested statements' plans (auto_explain, sent to this client as NOTICEs), once the
    session has planned them (the first call's plan counts the catalog reads of that), what
    the measured call did, and its nested statements' plans."""
    # Planned by a call whose floor lies past every row (the plans are generic: one per
    # statement whatever its floor), so it claims nothing.
    job_runner_step(worker="w", claim=claim, want_more=True, floor=_PAST_EVERY_ROW)
    plans: list[str] = []
    with connection.cursor() as cursor:
        pg = cursor.connection
        pg.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        for setting in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_analyze = on",
            "SET auto_explain.log_buffers = on",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_level = 'notice'",
            "SET client_min_messages = 'notice'",
        ):
            cursor.execute(setting)
    try:
        step = job_runner_step(worker="w", claim=claim, want_more=True, floor=floor)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")
    nested = [plan for plan in plans if "jobs_runner_step_v" not in plan]
    assert any("jobs_job" in plan for plan in nested), plans
    return buffers(nested), step, nested
