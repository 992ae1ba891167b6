"""`manage.py run_jobs [--burst] [--limit N]`: the job loop from the shell."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand

from jobs.conf import get_config
from jobs.runner import run_pending


class Command(BaseCommand):
    help = (
        "Run due jobs in this process. With --burst: drain what is due, print the summary, "
        "exit. Without: keep polling every JOBS_POLL_SECONDS until SIGTERM/Ctrl-C. SIGTERM "
        "(docker stop) finishes the running job and gives unstarted claims back."
    )

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="drain due jobs, then exit")
        parser.add_argument("--limit", type=int, default=None, help="run at most N jobs")

    def handle(self, *args, burst: bool, limit: int | None, **options):
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            while not stop.is_set():
                summary = run_pending(limit=limit, stop=stop)
                if burst or summary.claimed:
                    self.stdout.write(str(summary))
                    for line in summary.errors:
                        self.stdout.write(f"  {line}")
                if burst:
                    return
                if not summary.claimed:
                    stop.wait(get_config().poll_seconds)
            self.stdout.write("SIGTERM: stopped")
        except KeyboardInterrupt:
            self.stdout.write("interrupted: stopped")
        finally:
            signal.signal(signal.SIGTERM, previous)
