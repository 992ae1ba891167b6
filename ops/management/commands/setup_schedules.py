from django.core.management.base import BaseCommand

from ops.schedules import ensure_schedules


class Command(BaseCommand):
    help = "Create or correct the qcluster's schedules (idempotent)."

    def handle(self, *args, **options) -> None:
        counts = ensure_schedules()
        self.stdout.write(
            "schedules: {created} created, {updated} updated, {unchanged} unchanged".format(
                **counts
            )
        )
