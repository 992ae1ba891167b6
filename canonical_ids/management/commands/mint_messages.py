"""Record N messages under freshly minted ids (load generator for tests and the system test)."""

from __future__ import annotations

import json
import os
import sys
import time

from django.core.management.base import BaseCommand, CommandParser

from canonical_ids.minter import get_minter
from canonical_ids.services import record_message


class Command(BaseCommand):
    help = (
        "Record COUNT messages for RUN_ID with canonical ids minted by this process's writer "
        "slot; prints one JSON line {pid, slot, count, first_ts, last_ts}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run-id", required=True)
        parser.add_argument("--count", type=int, default=100)
        parser.add_argument("--author", default="")
        parser.add_argument("--source", default="mint_messages")
        parser.add_argument(
            "--start-at",
            type=float,
            default=0.0,
            help="wall-clock epoch seconds to wait for before recording (coordinated load tests)",
        )
        parser.add_argument(
            "--start-on-stdin",
            action="store_true",
            help="print `ready`, then wait for a line on stdin before recording: a coordinator "
            "starts several processes at one moment however long each took to start up",
        )
        parser.add_argument(
            "--hold",
            type=float,
            default=0.0,
            help="seconds to keep running (holding the slot) after recording",
        )

    def handle(self, *args, **options) -> None:
        author = options["author"] or f"pid-{os.getpid()}"
        first = last = ""
        delay = options["start_at"] - time.time()
        if delay > 0:
            time.sleep(delay)
        if options["start_on_stdin"]:
            self.stdout.write("ready")
            self.stdout.flush()
            sys.stdin.readline()
        for i in range(options["count"]):
            message = record_message(
                run_id=options["run_id"],
                text=f"message {i}",
                author=author,
                source=options["source"],
            )
            first = first or message.ts
            last = message.ts
        minter = get_minter()
        self.stdout.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "slot": minter.slot,
                    "count": options["count"],
                    "first_ts": first,
                    "last_ts": last,
                }
            )
        )
        self.stdout.flush()
        if options["hold"]:
            time.sleep(options["hold"])
