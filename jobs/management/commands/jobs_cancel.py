"""`manage.py jobs_cancel ID [ID ...]`: cancel jobs by id, running ones included (issue 37)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Job
from jobs.operator_actions import jobs_cancel


class Command(BaseCommand):
    help = (
        "Cancel the given jobs: a queued or failed one at once; a running one's worker is "
        "asked to stop it (its keeper sees the request within about half a second) and it "
        "ends cancelled once its handler has stopped. A completed or cancelled job is left as "
        "it is. Exits 1 when an id names no job."
    )

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", type=int, metavar="ID", help="job ids")

    def handle(self, *args, ids: list[int], **options):
        before = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
        jobs_cancel(jobs=Job.objects.filter(pk__in=ids))
        after = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
        missing = []
        for pk in dict.fromkeys(ids):
            was, now = before.get(pk), after.get(pk)
            if was is None:
                missing.append(pk)
                self.stdout.write(f"job #{pk}: no such job")
            elif was == Job.Status.PROCESSING and now == Job.Status.PROCESSING:
                self.stdout.write(
                    f"job #{pk}: running: its worker is asked to stop it; it ends cancelled "
                    "once its handler has stopped"
                )
            elif now == Job.Status.CANCELLED and was != Job.Status.CANCELLED:
                self.stdout.write(f"job #{pk}: cancelled (was {was})")
            else:
                self.stdout.write(f"job #{pk}: {now}: nothing to cancel")
        if missing:
            raise CommandError(f"no job with id {', '.join(map(str, missing))}")
