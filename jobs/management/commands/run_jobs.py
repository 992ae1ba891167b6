"""`manage.py run_jobs [--burst] [--limit N]`: the job loop from the shell."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from jobs.conf import get_config
from jobs.kind_caps import kind_caps_line, kind_caps_sync
from jobs.kind_rates import kind_rates_line, kind_rates_sync
from jobs.runner import RunSummary, run_pending
from project.command_loop import run_until_stopped, stopped_by_signals


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
        # The handlers' caps per kind, as this release's code says (issue 37, point 2).
        self.stdout.write(kind_caps_line(kind_caps_sync()))
        self.stdout.write(kind_rates_line(kind_rates_sync()))  # issue 38, point 3
        if burst:
            with stopped_by_signals(self.stdout) as stop:
                self._report(run_pending(limit=limit, stop=stop), always=True)
            return
        run_until_stopped(
            lambda stop: self._report(run_pending(limit=limit, stop=stop)),
            what="run_jobs",
            role="run_jobs",
            idle_seconds=lambda summary: 0 if summary.claimed else get_config().poll_seconds,
            stdout=self.stdout,
        )

    def _report(self, summary: RunSummary, *, always: bool = False) -> RunSummary:
        if always or summary.claimed:
            self.stdout.write(str(summary))
            for line in summary.errors:
                self.stdout.write(f"  {line}")
        return summary
