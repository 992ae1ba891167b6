from django.core.management.base import BaseCommand

from ops.demo import run_demo


class Command(BaseCommand):
    help = (
        "Create sample PIs, proposals, replies and jobs on the configured stores, run one pass "
        "of every schedule and print what happened."
    )

    def handle(self, *args, **options) -> None:
        self.stdout.write(run_demo().text())
