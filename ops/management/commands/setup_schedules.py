from django.core.management.base import BaseCommand

from ops.schedules import disable_unknown_schedules, ensure_schedules


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
            self.stdout.write(
                f"disabled unknown schedule {schedule.name!r} (id {schedule.pk}, func "
                f"{schedule.func}): schedules come only from code (ops/schedules.py)"
            )
