"""`manage.py run_jobs [--burst] [--limit N]`: the job loop from the shell."""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from jobs import registry
from jobs.conf import get_config
from jobs.kind_caps import kind_caps_line, kind_caps_sync
from jobs.kind_rates import kind_rates_line, kind_rates_sync
from jobs.registry import check_timeouts
from jobs.retire import retire_run_jobs
from jobs.runner import RunSummary, run_pending
from jobs.selectors import job_next_due_within
from project.command_loop import run_until_stopped, stopped_by_signals


class Command(BaseCommand):
    help = (
        "Run due jobs in this process. With --burst: drain what is due, print the summary, "
        "exit. Without: keep polling every JOBS_POLL_SECONDS until SIGTERM/Ctrl-C; a lost "
        "database connection is reconnected with a logged backoff. SIGTERM (docker stop) "
        "gives unstarted claims back, lets the running jobs finish for "
        "JOBS_SHUTDOWN_GRACE_SECONDS, then asks them to stop. Exits 3 when a handler did "
        "not stop when asked (a timeout, a cancel): the process must be replaced."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="drain due jobs, then exit")
        parser.add_argument("--limit", type=int, default=None, help="run at most N jobs")

    def handle(self, *args, burst: bool, limit: int | None, **options):
        self._limit = limit
        try:  # a timeout that cannot fit inside Q_TIMEOUT, named (issue 37): one line
            check_timeouts()
        except ImproperlyConfigured as exc:
            raise CommandError(f"configuration error: {exc}") from exc
        # Slots a kind keeps for itself must fit the slots (issue 37, point 3).
        registry.check_reservations_at_start()
        # The handlers' caps per kind, as this release's code says (issue 37, point 2).
        self.stdout.write(kind_caps_line(kind_caps_sync()))
        self.stdout.write(kind_rates_line(kind_rates_sync()))  # issue 38, point 3
        if burst:
            with stopped_by_signals(self.stdout) as stop:
                self._report(run_pending(limit=limit, stop=stop), always=True)
            return
        run_until_stopped(
            self._pass,
            what="run_jobs",
            role="run_jobs",
            idle_seconds=lambda wait: wait,
            stdout=self.stdout,
        )

    def _pass(self, stop: threading.Event) -> float:
        """One drain, then how long to wait before the next: none after a drain that took
        jobs; else until the next job due within JOBS_POLL_SECONDS (one queued for later, a
        rate-limited kind's next token: issue 38, point 3), at most that. Read inside the
        pass, so a lost connection is the loop's to log and retry."""
        summary = self._report(run_pending(limit=self._limit, stop=stop))
        if summary.claimed:
            return 0.0
        return job_next_due_within(get_config().poll_seconds)

    def _report(self, summary: RunSummary, *, always: bool = False) -> RunSummary:
        if always or summary.claimed:
            self.stdout.write(str(summary))
            for line in summary.errors:
                self.stdout.write(f"  {line}")
        if summary.retire:
            self.stdout.write(
                f"retiring this process: the handlers of jobs {summary.hung} did not stop "
                "when asked (exit 3: start a new one)"
            )
            self.stdout.flush()
            retire_run_jobs(summary.hung)
        return summary
