"""Run the notification sweeps by hand: the same code the qcluster schedules call."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandParser

from notifications.sweeps import SWEEPS, run_sweep


class Command(BaseCommand):
    help = "Run the notification sweeps (new_proposal, proposal_review, digest); print summaries."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run one cycle and exit.")
        parser.add_argument(
            "--sweep", choices=SWEEPS, action="append", help="Only this sweep (repeatable)."
        )
        parser.add_argument(
            "--interval", type=float, default=60.0, help="Seconds between cycles without --once."
        )

    def handle(self, *args, once: bool, sweep: list[str] | None, interval: float, **options):
        kinds = sweep or list(SWEEPS)
        while True:
            for kind in kinds:
                summary = run_sweep(kind)
                self.stdout.write(
                    f"{kind}: users={summary.users} sent={summary.sent} failed={summary.failed} "
                    f"expired={summary.expired} skipped={summary.skipped} errors={summary.errors} "
                    f"reconciled={summary.reconciled} stepped_down={summary.stepped_down} "
                    f"seconds={summary.seconds}"
                )
            if once:
                return
            time.sleep(interval)
