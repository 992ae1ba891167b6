"""Run the notification sweeps by hand: the same code the qcluster schedules call."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandParser

from notifications.sweeps import SWEEPS, run_sweep
from project.reconnect import service_loop


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
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            service_loop(
                lambda: self._cycle(kinds),
                what="run_sweeps",
                stop=stop,
                idle_seconds=lambda _result: interval,
            )
            self.stdout.write("SIGTERM: stopped")
        except KeyboardInterrupt:
            self.stdout.write("interrupted: stopped")
        finally:
            signal.signal(signal.SIGTERM, previous)

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
