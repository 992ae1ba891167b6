from django.core.management.base import BaseCommand, CommandError

from ops.demo import DemoRefused, run_demo


class Command(BaseCommand):
    help = (
        "On the embedded database only: create sample PIs, proposals, replies and jobs, run "
        "one pass of every schedule and print what happened."
    )

    def handle(self, *args, **options) -> None:
        try:
            report = run_demo()
        except DemoRefused as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(report.text())
