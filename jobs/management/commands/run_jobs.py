"""`manage.py run_jobs [--burst] [--limit N]`: the job loop from the shell."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand

from jobs.conf import get_config
from jobs.runner import RunSummary, run_pending
from project.reconnect import service_loop


class Command(BaseCommand):
    help = (
        "Run due jobs in this process. With --burst: drain what is due, print the summary, "
        "exit. Without: keep polling every JOBS_POLL_SECONDS until SIGTERM/Ctrl-C; a lost "
        "database connection is reconnected with a logged backoff. SIGTERM (docker stop) "
        "finishes the running job and gives unstarted claims back."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="drain due jobs, then exit")
        parser.add_argument("--limit", type=int, default=None, help="run at most N jobs")

    def handle(self, *args, burst: bool, limit: int | None, **options):
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            if burst:
                self._report(run_pending(limit=limit, stop=stop), always=True)
                return
            service_loop(
                lambda: self._report(run_pending(limit=limit, stop=stop)),
                what="run_jobs",
                stop=stop,
                idle_seconds=lambda summary: 0 if summary.claimed else get_config().poll_seconds,
            )
            self.stdout.write("SIGTERM: stopped")
        except KeyboardInterrupt:
            self.stdout.write("interrupted: stopped")
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _report(self, summary: RunSummary, *, always: bool = False) -> RunSummary:
        if always or summary.claimed:
            self.stdout.write(str(summary))
            for line in summary.errors:
                self.stdout.write(f"  {line}")
        return summary
