#!/usr/bin/env python
"""Cost of keeping and relaying attachments (issue 21.1), next to the same replies without.

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/attachments.py
    .venv/bin/python bench/attachments.py --mails 50 --kib 512

In one process, on a folder store, for N instructions (Slack off: the database inbox, then
Slack on against the local Slack server: the post, then files_upload_v2 in its thread):
  * baseline: the same replies without attachments, poll + relay, mails/s;
  * with attachments: each reply carries a PDF of --kib KiB and an inline image; mails/s,
    the bytes stored under attachments/, database statements per mail.
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
os.environ.setdefault("SLACK_BOT_TOKEN", "")

import django  # noqa: E402

django.setup()

from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)

sys.path.insert(0, str(ROOT / "bench"))
from inbound import make_notification  # noqa: E402


def make_mails(count: int, token: str, tag: str, kib: int) -> list[bytes]:
    from tests.support.mail import build_mail, with_attachments

    pdf = [(f"comments-{tag}.pdf", os.urandom(kib * 1024), "application/pdf")] if kib else []
    return [
        build_mail(
            token=token,
            body=f"Please see my comments attached ({i}).",
            message_id=f"<bench-att-{tag}-{i}@university.example>",
            attach=with_attachments(pdf_name=None, inline_image=bool(kib), extra=pdf),
        )
        for i in range(count)
    ]


def run(label: str, mails: list[bytes]) -> None:
    from bench.support import counting_statements
    from inbound_email.models import Reply, ReplyAttachment
    from inbound_email.poller import poll_once
    from inbound_email.stores import default_store
    from jobs import run_pending

    store = default_store()
    for i, data in enumerate(mails):
        store.put(f"{label}-{i:05d}", data)
    with counting_statements() as statements:
        started = time.perf_counter()
        poll_once(limit=len(mails) + 10)
        polled = time.perf_counter() - started
        for _ in range(20):  # the attachments' step is a second job per reply
            run_pending()
            if not Reply.objects.filter(relay_status__in=["pending", "posting"]).exists():
                break
        whole = time.perf_counter() - started
    n = len(mails)
    stored = ReplyAttachment.objects.filter(reply__inbound_email__store_key__startswith=label)
    size = sum(stored.values_list("size", flat=True))
    print(
        f"  {label:<34} {n / whole:7.1f} mails/s (poll {polled:.2f}s, relay "
        f"{whole - polled:.2f}s); {statements[0] / n:5.1f} DB statements per mail; "
        f"{stored.count()} attachments, {size / 1024 / 1024:.1f} MiB stored; "
        f"{sum(map(len, mails)) / n / 1024:.0f} KiB per mail"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=50)
    parser.add_argument("--kib", type=int, default=512, help="size of each PDF")
    args = parser.parse_args()

    from tests.support.slack_server import SlackServer

    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            override_settings(MAX_REPLIES_PER_TOKEN_PER_HOUR=10**9, INBOUND_EMAIL_STORE=folder),
        ):
            notification = make_notification()
            token = notification.token
            print(f"{args.mails} replies per row, folder store, PDF {args.kib} KiB + inline PNG")
            print("Slack off (database inbox):")
            run("inbox-plain", make_mails(args.mails, token, "ip", 0))
            run("inbox-attachments", make_mails(args.mails, token, "ia", args.kib))
            with SlackServer() as slack:
                with override_settings(SLACK_BOT_TOKEN="xoxb-bench", SLACK_API_URL=slack.base_url):
                    print("Slack on (local Slack server: post, then files_upload_v2):")
                    run("slack-plain", make_mails(args.mails, token, "sp", 0))
                    run("slack-attachments", make_mails(args.mails, token, "sa", args.kib))
                print(f"  channel C0BENCH shows {len(slack.shared_files('C0BENCH'))} files")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
