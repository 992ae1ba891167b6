"""django-q2's qcluster, preceded by `ensure_schedules()` so the schedules always match code."""

from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from ops.schedules import ensure_schedules


class Command(DjangoQClusterCommand):
    help = "Create/correct the schedules, then start the django-q2 cluster."

    def handle(self, *args, **options):
        counts = ensure_schedules()
        self.stdout.write(
            "schedules: {created} created, {updated} updated, {unchanged} unchanged".format(
                **counts
            )
        )
        return super().handle(*args, **options)
