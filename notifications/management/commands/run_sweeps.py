"""Run the notification sweeps by hand: the same code the qcluster schedules call."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from notifications.sweeps import SWEEPS, run_sweep
from project.command_loop import run_until_stopped


class Command(BaseCommand):
    help = (
        "Run the notification sweeps (new_proposal, proposal_review, digest); print summaries. "
        "Without --once it runs a cycle every --interval seconds until SIGTERM/Ctrl-C; a lost "
        "database connection (or a failed cycle) is retried with a logged backoff."
    )

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
        if once:
            self._cycle(kinds)
            return
        run_until_stopped(
            lambda _stop: self._cycle(kinds),
            what="run_sweeps",
            role="run_sweeps",
            idle_seconds=lambda _result: interval,
            stdout=self.stdout,
        )

    def _cycle(self, kinds: list[str]) -> None:
        for kind in kinds:
            summary = run_sweep(kind)
            self.stdout.write(
                f"{kind}: users={summary.users} sent={summary.sent} failed={summary.failed} "
                f"expired={summary.expired} skipped={summary.skipped} errors={summary.errors} "
                f"reconciled={summary.reconciled} stepped_down={summary.stepped_down} "
                f"seconds={summary.seconds}"
            )
        self.stdout.flush()
