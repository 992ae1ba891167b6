#!/usr/bin/env python
"""Cost of the instruction relay with Slack on: claim -> commit -> post -> record.

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/relay.py

Against the local Slack Web API server (tests/support/slack_server.py), in one process:
  * baseline: bare `post_message` calls (slack-sdk + HTTP), the floor no relay beats;
  * relay: `run_pending()` over N accepted instructions (claim, post with metadata, record,
    notification responded, mail processed), relays/s and database statements per relay;
  * relay after an unknown outcome: the same with every reply marked unsure, so each attempt
    first reads conversations.history (nothing found) and then posts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)

sys.path.insert(0, str(ROOT / "bench"))
from inbound import make_mails, make_notification  # noqa: E402


def accept(store, count: int, tag: str) -> None:
    """N accepted instructions (pending relays) from N mails, each to its own notification
    (the rate limit is per notification)."""
    from inbound_email.poller import poll_once
    from jobs.models import Job

    for i in range(count):
        notification = make_notification()
        mail = make_mails(2, notification.token, f"{tag}-{i}")[1]  # the odd one: an instruction
        store.put(f"{tag}-{i:06d}", mail)
    poll_once(store=store, limit=count + 10)
    Job.objects.all().delete()  # relays are run below, one drain per scenario


def relay_all(*, unsure: bool) -> tuple[float, float, int]:
    from django.utils import timezone

    from bench.support import counting_statements
    from inbound_email.models import Reply
    from inbound_email.services.relay import RELAY_JOB_KIND
    from jobs import enqueue, run_pending

    pending = list(Reply.objects.filter(relay_status="pending").values_list("pk", flat=True))
    if unsure:
        Reply.objects.filter(pk__in=pending).update(relay_unsure_since=timezone.now())
    for reply_id in pending:
        enqueue(RELAY_JOB_KIND, {"reply_id": reply_id})
    with counting_statements() as statements:
        started = time.perf_counter()
        run_pending()
        seconds = time.perf_counter() - started
    posted = Reply.objects.filter(pk__in=pending, relay_status="posted").count()
    return seconds, statements[0] / max(1, len(pending)), posted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relays", type=int, default=200)
    parser.add_argument(
        "--no-unsure", action="store_true", help="skip the look-up row (code before issue 10)"
    )
    args = parser.parse_args()
    n = args.relays

    from tests.support.slack_server import SlackServer

    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        with (
            SlackServer() as slack,
            tempfile.TemporaryDirectory() as folder,
            override_settings(
                SLACK_BOT_TOKEN="xoxb-bench",
                SLACK_API_URL=slack.base_url,
                INBOUND_EMAIL_STORE=folder,
            ),
        ):
            from inbound_email.slack import post_message
            from inbound_email.stores import store_from_url

            store = store_from_url(folder)
            started = time.perf_counter()
            for i in range(n):
                post_message(channel="C0BASE", text=f"baseline {i}")
            baseline = time.perf_counter() - started

            accept(store, n, "plain")
            plain, plain_statements, plain_posted = relay_all(unsure=False)
            if not args.no_unsure:
                accept(store, n, "unsure")
                unsure, unsure_statements, unsure_posted = relay_all(unsure=True)

            print(f"{n} relays per row, local Slack server, PostgreSQL")
            print(f"  baseline bare chat.postMessage:      {n / baseline:8.1f} posts/s")
            print(
                f"  relay (claim, post, record):         {n / plain:8.1f} relays/s "
                f"= {baseline / plain:.2f} of the baseline; {plain_statements:.1f} DB "
                f"statements per relay; posted {plain_posted}/{n}"
            )
            if not args.no_unsure:
                print(
                    f"  relay after an unknown outcome:      {n / unsure:8.1f} relays/s "
                    f"(history look-up, then post); {unsure_statements:.1f} statements per "
                    f"relay; posted {unsure_posted}/{n}"
                )
            print(f"  channel C0BENCH holds {len(slack.channel_messages('C0BENCH'))} messages")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
