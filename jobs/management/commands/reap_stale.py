"""`manage.py reap_stale [--dry-run] [--older-than S [--force]]`: reclaim jobs of dead workers."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.conf import get_config
from jobs.reaper import jobs_reap_stale


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
            help=(
                "reap rows whose last heartbeat is older than S seconds (default: lease "
                "expiry); S below JOBS_LEASE_SECONDS is refused without --force"
            ),
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help=(
                "allow --older-than below JOBS_LEASE_SECONDS: also reaps jobs whose worker is "
                "alive (their work rolls back and runs again)"
            ),
        )

    def handle(
        self, *args, dry_run: bool, older_than: float | None, force: bool, **options
    ) -> None:
        if older_than is not None:
            if older_than < 0:
                raise CommandError("--older-than must be >= 0 seconds")
            config = get_config()
            lease = config.lease_seconds
            # A live worker renews its heartbeat every JOBS_HEARTBEAT_SECONDS; below the lease
            # a late beat (a busy host, a slow database) would look like a dead worker.
            if older_than < lease and not force:
                raise CommandError(
                    f"--older-than {older_than:g} is below JOBS_LEASE_SECONDS={lease:g}: it "
                    "would reap jobs whose worker is still alive (heartbeat every "
                    f"{config.heartbeat_seconds:g}s), rolling back their work and "
                    "repeating their side effects. Use a value >= the lease, or add --force "
                    "if you know those workers are dead."
                )
        reaped = jobs_reap_stale(older_than=older_than, dry_run=dry_run)
        verb = "would reap" if dry_run else "reaped"
        self.stdout.write(f"{verb} {len(reaped)} job(s)")
        for job in reaped:
            self.stdout.write(f"  {job.describe()}")
