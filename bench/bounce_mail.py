#!/usr/bin/env python
"""Cost of fake bounce mail in one poll (issue 28.6): 10 mails of 10 MB from MAILER-DAEMON.

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_bounces \
        .venv/bin/python bench/bounce_mail.py
    .venv/bin/python bench/bounce_mail.py --mails 10 --mib 10 --unbounded

Anyone can mail the inbound address "from" `MAILER-DAEMON@anything`; such a mail is read as
a bounce report, and flufl.bounce's detectors cost time per line of what they are given
(1.5 MB of blank lines took 43 s before issue 28.6). It prints, in one process, on a folder
store:
  * baseline: one poll of --mails small genuine-looking bounces (Exim's text, 1 KB);
  * the fakes: one poll of --mails fake bounces of just under --mib MiB each (the size
    INBOUND_EMAIL_MAX_BYTES allows), in three shapes in turn: blank lines in one text part;
    blank lines in 95 text parts of ~105 KB (each under the text limit); long lines;
    with the outcome of each and the seconds of the whole poll (target: within 10 s);
  * with --unbounded: flufl.bounce alone on one whole fake (what the detectors cost before
    the report window), for comparison; slow by design.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)

GONE = "gone.pi@example.net"
_HEADERS = (
    "From: Mail Delivery System <MAILER-DAEMON@attacker.example>\n"
    "To: replies@reply.example.org\n"
    "Subject: Mail delivery failed: returning message to sender\n"
)
_EXIM = (
    "This message was created automatically by mail delivery software.\n\n"
    "A message that you sent could not be delivered to one or more of its\n"
    "recipients. This is a permanent error. The following address(es) failed:\n\n"
    f"  {GONE}\n    550 5.1.1 User unknown\n"
)


def genuine_bounce(index: int) -> bytes:
    return (
        _HEADERS + f"Message-ID: <bounce-{index}@mx.example>\n"
        "Content-Type: text/plain; charset=us-ascii\n\n" + _EXIM
    ).encode()


def fake_bounce(index: int, size: int) -> bytes:
    """A fake bounce of just under `size` bytes, in one of three shapes."""
    head = _HEADERS + f"Message-ID: <fake-{index}@attacker.example>\n"
    shape = index % 3
    if shape == 0:  # blank lines in one text part
        raw = (head + "Content-Type: text/plain\n\n").encode()
        return raw + b"\n" * (size - len(raw))
    if shape == 1:  # blank lines in 95 text parts, each under the 1 MiB text limit
        boundary = "b0undary"
        raw = head + f'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="{boundary}"\n\n'
        parts = 95
        part = (size - len(raw) - parts * 60) // parts
        body = "".join(
            f"--{boundary}\nContent-Type: text/plain\n\n" + "\n" * part for _ in range(parts)
        )
        return (raw + body + f"--{boundary}--\n").encode()
    raw = (head + "Content-Type: text/plain\n\n").encode()  # long lines
    line = b"x" * 997 + b"\n"
    return raw + line * ((size - len(raw)) // len(line))


def poll_all(folder: str, mails: list[bytes], tag: str) -> tuple[float, Counter]:
    from inbound_email.models import InboundEmail
    from inbound_email.poller import poll_once
    from inbound_email.stores import store_from_url

    store = store_from_url(folder)
    for index, raw in enumerate(mails):
        store.put(f"{tag}-{index:03d}", raw)
    started = time.perf_counter()
    poll_once(store=store)
    elapsed = time.perf_counter() - started
    outcomes = Counter(
        f"{row.status}:{row.reason}"
        for row in InboundEmail.objects.filter(store_key__startswith=tag).only("status", "reason")
    )
    return elapsed, outcomes


def unbounded_flufl(raw: bytes) -> float:
    """flufl.bounce over the whole mail, as the detectors ran before issue 28.6."""
    from email import message_from_bytes

    from flufl.bounce import all_failures

    started = time.perf_counter()
    all_failures(message_from_bytes(raw))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=10)
    parser.add_argument("--mib", type=float, default=10)
    parser.add_argument(
        "--unbounded", action="store_true", help="also time flufl on one whole fake"
    )
    args = parser.parse_args()
    size = int(args.mib * 1024 * 1024)

    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        from inbound_email.conf import get_config

        config = get_config()
        print(
            f"report window {config.max_report_bytes} body bytes, text limit "
            f"{config.max_text_bytes}, mail limit {config.max_bytes}; load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        with tempfile.TemporaryDirectory() as folder, override_settings(INBOUND_EMAIL_STORE=folder):
            genuine = [genuine_bounce(i) for i in range(args.mails)]
            seconds, outcomes = poll_all(folder, genuine, "genuine")
            print(
                f"baseline: {args.mails} genuine-looking bounces of {len(genuine[0])} bytes: "
                f"one poll {seconds:.2f} s {dict(outcomes)}"
            )
            fakes = [fake_bounce(i, size) for i in range(args.mails)]
            total = sum(len(raw) for raw in fakes) / 1024 / 1024
            seconds, outcomes = poll_all(folder, fakes, "fake")
            print(
                f"fakes: {args.mails} fake bounces ({total:.1f} MiB in all, "
                f"{len(fakes[0])} bytes the first): one poll {seconds:.2f} s "
                f"({seconds / max(args.mails, 1):.2f} s a mail) {dict(outcomes)}"
            )
            if args.unbounded:
                seconds = unbounded_flufl(fakes[0])
                print(f"unbounded: flufl.bounce alone on one whole fake: {seconds:.2f} s")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
