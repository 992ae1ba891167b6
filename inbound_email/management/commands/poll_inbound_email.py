"""`manage.py poll_inbound_email [--once]`: the poller the qcluster schedule runs, by hand."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from inbound_email.conf import get_config
from inbound_email.poller import poll_once
from project.command_loop import run_until_stopped


class Command(BaseCommand):
    help = (
        "Poll the inbound mail store (S3 or folder) and handle replies. Without --once it "
        "polls every --interval seconds until SIGTERM/Ctrl-C; a lost database connection (or "
        "a failed pass) is retried with a logged backoff."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="One bounded pass, then exit.")
        parser.add_argument("--limit", type=int, default=None, help="Max objects handled per pass.")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="Seconds between passes without --once (default INBOUND_EMAIL_POLL_INTERVAL).",
        )

    def handle(
        self, *args, once: bool, limit: int | None, interval: float | None, **options
    ) -> None:
        interval = get_config().poll_interval if interval is None else interval
        if once:
            self._pass(limit)
            return
        run_until_stopped(
            lambda _stop: self._pass(limit),
            what="poll_inbound_email",
            role="poll_inbound_email",
            idle_seconds=lambda _summary: interval,
            stdout=self.stdout,
        )

    def _pass(self, limit: int | None) -> None:
        summary = poll_once(limit=limit)
        self.stdout.write(json.dumps(summary.as_dict(), sort_keys=True))
        self.stdout.flush()
