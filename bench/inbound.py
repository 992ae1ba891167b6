#!/usr/bin/env python
"""Throughput of the inbound-mail path: store -> ledger -> parse -> reply -> relay -> delete.

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/inbound.py
    .venv/bin/python bench/inbound.py --mails 300 --stores folder

For each store (a local folder, S3 through moto in-process) it prints, in one process:
  * baseline: the store alone (list + get + delete every object): the floor no poller beats;
  * whole path: `poll_once()` then `run_pending()` (instructions relayed, Slack off, to the
    database inbox), mails/s;
  * parsing: `parse_mail` alone on the same bytes, and its share of the whole-path time.
Half of the mails carry a rating only, half a rating and an instruction.

Then one row per parse bomb of tests/support/mail_bombs.py (issue 10), next to a normal
mail as the baseline: the parse as the poller does it (header-only checks, then the body),
best of --bomb-repeat runs, and one whole poll of the bomb alone (`poll_once` on a folder
store holding only it), with the outcome (quarantined with the limit named, or processed).
`--mails 0` prints only the bomb rows.
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
for _name, _value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ.setdefault(_name, _value)
os.environ.pop("AWS_ENDPOINT_URL", None)

import django  # noqa: E402

django.setup()

from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)


def make_mails(count: int, token: str, tag: str) -> list[bytes]:
    from email.message import EmailMessage

    from notifications.reply_address import reply_address_for

    mails = []
    for i in range(count):
        msg = EmailMessage()
        msg["From"] = "Ada Lovelace <pi@university.example>"
        msg["To"] = reply_address_for(token)
        msg["Subject"] = "Re: Quantum sensing of soil moisture"
        msg["Date"] = "Tue, 01 Dec 2026 10:00:00 +0000"
        msg["Message-ID"] = f"<bench-{tag}-{i}@university.example>"
        body = f"Rating: {i % 5 + 1} stars\n"
        if i % 2:
            body += "Please shorten the abstract and add a timeline for aim 2.\n"
        body += "\nOn Mon, 30 Nov 2026, Assistant wrote:\n> Please rate this proposal\n" * 3
        msg.set_content(body)
        mails.append(msg.as_bytes())
    return mails


def make_notification():
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from notifications.models import EmailNotification, Proposal

    user = get_user_model().objects.create(username=f"pi-{time.monotonic_ns()}")
    proposal = Proposal.objects.create(
        title="Quantum sensing", pi=user, run_id="bench-run", slack_channel="C0BENCH"
    )
    now = timezone.now()
    return EmailNotification.objects.create(
        user=user,
        proposal=proposal,
        kind=EmailNotification.Kind.PROPOSAL_REVIEW,
        status=EmailNotification.Status.SENT,
        to_address="pi@university.example",
        sent_at=now,
        ses_message_id=f"bench-{time.monotonic_ns()}",
        expires_at=now + timezone.timedelta(days=7),
    )


def fill(store, mails: list[bytes], tag: str) -> list[str]:
    keys = [f"{getattr(store, 'prefix', '')}{tag}-{i:06d}" for i in range(len(mails))]
    for key, data in zip(keys, mails, strict=True):
        store.put(key, data)
    return keys


def run_store(name: str, url: str, mails: list[bytes]) -> None:
    from inbound_email.models import InboundEmail
    from inbound_email.parsing import parse_mail
    from inbound_email.poller import poll_once
    from inbound_email.stores import store_from_url
    from jobs import run_pending

    store = store_from_url(url)

    # Baseline: the store alone.
    fill(store, mails, "baseline")
    started = time.perf_counter()
    for page in store.list():
        for obj in page:
            store.get(obj.key)
        store.delete_many([obj.key for obj in page])
    baseline = time.perf_counter() - started

    # Whole path.
    from bench.support import counting_statements

    fill(store, mails, f"{name}-path")
    with counting_statements() as statements:
        started = time.perf_counter()
        summary = poll_once(store=store, limit=len(mails) + 10)
        polled = time.perf_counter() - started
        poll_statements = statements[0]
        run_pending()
        whole = time.perf_counter() - started
    left = sum(len(page) for page in store.list())
    statuses = dict.fromkeys(InboundEmail.Status.values, 0)
    for status in InboundEmail.objects.filter(store_key__contains=f"{name}-path").values_list(
        "status", flat=True
    ):
        statuses[status] += 1

    # Parsing alone, same bytes.
    started = time.perf_counter()
    for data in mails:
        parse_mail(data)
    parsing = time.perf_counter() - started

    n = len(mails)
    print(f"[{name}] {n} mails, {sum(map(len, mails)) // n} bytes each on average")
    print(f"  baseline store only (list+get+delete): {n / baseline:8.1f} mails/s")
    print(
        f"  whole path (poll + relay):             {n / whole:8.1f} mails/s  "
        f"(poll {polled:.2f}s, relay {whole - polled:.2f}s, total {whole:.2f}s)"
    )
    print(
        f"  DB statements per mail: poll {poll_statements / n:.1f}, "
        f"relay {(statements[0] - poll_statements) / max(1, n // 2):.1f} per instruction"
    )
    print(f"  parse_mail alone:                      {n / parsing:8.1f} mails/s")
    print(f"  share of whole-path time in parsing:   {100 * parsing / whole:8.1f} %")
    print(f"  outcomes: {dict(summary.outcomes)}; ledger {statuses}; left in intake: {left}")


def run_bombs(notification, repeat: int) -> None:
    from inbound_email.exceptions import MailLimitExceeded
    from inbound_email.models import InboundEmail
    from inbound_email.parsing import parse_headers, parse_mail
    from inbound_email.poller import poll_once
    from inbound_email.replies import header_rejection
    from inbound_email.stores import store_from_url
    from notifications.reply_address import reply_address_for
    from tests.support.mail_bombs import corpus

    def parse_like_the_poller(raw: bytes) -> None:
        try:
            if header_rejection(parse_headers(raw)) is None:
                parse_mail(raw)
        except MailLimitExceeded:
            pass

    rows = [("normal mail (baseline)", make_mails(2, notification.token, "bomb-base")[1])]
    for bomb in corpus(to=reply_address_for(notification.token)):
        unique_id = f"<bomb-{bomb.name}@university.example>".encode()
        rows.append((bomb.name, bomb.raw.replace(b"<bomb@university.example>", unique_id)))

    print(f"[parse bombs] best of {repeat} parses; one whole poll each; folder store")
    print(
        f"  {'mail':28} {'size':>8}  {'parse':>9} {'x base':>7}  {'poll':>9} {'x base':>7}  outcome"
    )
    base_parse = base_poll = 0.0
    with tempfile.TemporaryDirectory() as folder, override_settings(INBOUND_EMAIL_STORE=folder):
        store = store_from_url(folder)
        for index, (name, raw) in enumerate(rows):
            parse = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                parse_like_the_poller(raw)
                parse = min(parse, time.perf_counter() - started)
            key = f"bomb-{index:02d}"
            store.put(key, raw)
            started = time.perf_counter()
            poll_once(store=store)
            poll = time.perf_counter() - started
            row = InboundEmail.objects.get(store_key=key)
            outcome = f"{row.status}:{row.reason}" if row.reason else str(row.status)
            if index == 0:
                base_parse, base_poll = parse, poll
            print(
                f"  {name:28} {len(raw) / 1e6:6.2f}MB"
                f"  {parse * 1e3:7.1f}ms {parse / base_parse:6.1f}x"
                f"  {poll * 1e3:7.1f}ms {poll / base_poll:6.1f}x  {outcome}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=500)
    parser.add_argument("--stores", default="folder,s3", help="comma list of folder, s3")
    parser.add_argument("--bomb-repeat", type=int, default=5, help="parses per bomb (best of)")
    args = parser.parse_args()

    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        with override_settings(MAX_REPLIES_PER_TOKEN_PER_HOUR=10**9):
            notification = make_notification()
            from django.conf import settings

            print(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
            for name in args.stores.split(",") if args.mails else []:
                if name == "folder":
                    with tempfile.TemporaryDirectory() as folder:
                        with override_settings(INBOUND_EMAIL_STORE=folder):
                            mails = make_mails(args.mails, notification.token, "folder")
                            run_store("folder", folder, mails)
                elif name == "s3":
                    import boto3
                    from moto import mock_aws

                    with mock_aws(), override_settings(INBOUND_EMAIL_STORE="s3://bench/inbound"):
                        boto3.client("s3").create_bucket(Bucket="bench")
                        mails = make_mails(args.mails, notification.token, "s3")
                        run_store("s3-moto", "s3://bench/inbound", mails)
            run_bombs(notification, args.bomb_repeat)
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
