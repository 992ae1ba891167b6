from django.core.management.base import BaseCommand

from ops.schedules import disable_unknown_schedules, disabled_line, ensure_schedules


class Command(BaseCommand):
    help = "Create or correct the qcluster's schedules (idempotent)."

    def handle(self, *args, **options) -> None:
        counts = ensure_schedules()
        self.stdout.write(
            "schedules: {created} created, {updated} updated, {unchanged} unchanged".format(
                **counts
            )
        )
        for schedule in disable_unknown_schedules():
            self.stdout.write(disabled_line(schedule))
