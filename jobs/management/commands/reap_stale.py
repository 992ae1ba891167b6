"""`manage.py reap_stale [--dry-run] [--older-than S]`: reclaim jobs of dead workers."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.services import jobs_reap_stale


class Command(BaseCommand):
    help = (
        "Put `processing` jobs whose lease expired (their worker died) back in the queue with "
        "backoff, or fail them when their attempts are used up. Safe to run beside the "
        "scheduled reaper and other reapers."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be reaped, change nothing"
        )
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="S",
            help="reap rows whose last heartbeat is older than S seconds (default: lease expiry)",
        )

    def handle(self, *args, dry_run: bool, older_than: float | None, **options):
        if older_than is not None and older_than < 0:
            raise CommandError("--older-than must be >= 0 seconds")
        reaped = jobs_reap_stale(older_than=older_than, dry_run=dry_run)
        verb = "would reap" if dry_run else "reaped"
        self.stdout.write(f"{verb} {len(reaped)} job(s)")
        for job in reaped:
            self.stdout.write(f"  {job.describe()}")
