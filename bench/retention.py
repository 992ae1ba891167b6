#!/usr/bin/env python
"""Junk mail against the database: what 1 MiB junk mails leave behind, before and after the
retention prune (issue 21, point 5).

Usage (from the project root; a throwaway test_<name> database is created and dropped):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/retention.py
    .venv/bin/python bench/retention.py --mails 100000 --size-kib 1024 --batch 200

What it does, in one process:
  1. Streams `--mails` junk mails of `--size-kib` each through a folder store in batches of
     `--batch`: a batch is written, polled (every mail is rejected `no_token` on its headers:
     no token, not from a PI) and leaves the intake, so at most one batch is ever on disk.
     The body is base64 of random bytes (a spam attachment: PostgreSQL cannot compress it,
     the honest worst case for TOAST).
  2. Prints the database size at the peak (every junk row within the retention), the bytes
     one row costs, and the store-only baseline (writing the same files) next to the poll.
  3. Runs the pruning schedule's function as it would run once the mails are older than
     INBOUND_RETENTION_DAYS (`inbound_email_prune(now=… + retention + 1 day)`), then a plain
     VACUUM of the ledger (what autovacuum does after a large delete), and prints the
     database size after each.
  4. Prints the steady state: rows kept within the retention window at a given junk rate
     cost `rate x days x bytes per row`, which no prune can lower (the 64 KiB each is what
     the issue asks to keep).

A scaled run (`--mails 2000`) gives the per-row figures; the totals of the full run are
`--mails` times those (printed as the estimate).
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("SLACK_BOT_TOKEN", "")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import (  # noqa: E402
    override_settings,
    setup_databases,
    setup_test_environment,
    teardown_databases,
)

MIB = 1024 * 1024


def junk_head(index: int) -> bytes:
    return (
        f"From: Prize Department <winner{index}@lottery.example>\r\n"
        f"To: replies@reply.localhost\r\n"
        f"Subject: You have won #{index}\r\n"
        f"Date: Fri, 04 Dec 2026 05:00:00 +0000\r\n"
        f"Message-ID: <junk-{index}@lottery.example>\r\n"
        "MIME-Version: 1.0\r\n"
        "Content-Type: application/octet-stream\r\n"
        "Content-Transfer-Encoding: base64\r\n\r\n"
    ).encode()


def junk_body(size: int) -> bytes:
    """Base64 of random bytes in 76-character lines, `size` bytes long (incompressible)."""
    encoded = base64.encodebytes(os.urandom(size * 3 // 4 + 64)).replace(b"\n", b"\r\n")
    return encoded[:size]


def database_size() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return cursor.fetchone()[0]


def ledger_size() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('inbound_email_inboundemail')")
        return cursor.fetchone()[0]


def ledger_parts() -> tuple[int, int, int]:
    """(heap, TOAST, indexes) bytes of the ledger table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size(c.oid),"
            " coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
            " pg_indexes_size(c.oid)"
            " FROM pg_class c WHERE c.relname = 'inbound_email_inboundemail'"
        )
        return cursor.fetchone()


def mb(n: float) -> str:
    return f"{n / 1e6:8.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--full-mails", type=int, default=100_000, help="for the estimate")
    parser.add_argument("--junk-per-day", type=int, default=1000, help="for the steady state")
    args = parser.parse_args()

    from inbound_email.conf import get_config
    from inbound_email.models import InboundEmail
    from inbound_email.poller import poll_once
    from inbound_email.services.retention import inbound_email_prune
    from inbound_email.stores import store_from_url

    size = args.size_kib * 1024
    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            override_settings(INBOUND_EMAIL_STORE=folder, INBOUND_EMAIL_MAX_PER_RUN=10**6),
        ):
            store = store_from_url(folder)
            empty = database_size()
            body = junk_body(size - len(junk_head(0)))
            write_s = poll_s = 0.0
            done = 0
            while done < args.mails:
                count = min(args.batch, args.mails - done)
                started = time.perf_counter()
                for index in range(done, done + count):
                    head = junk_head(index)
                    store.put(f"junk-{index:07d}", head + body[: size - len(head)])
                write_s += time.perf_counter() - started
                started = time.perf_counter()
                summary = poll_once(store=store)
                poll_s += time.perf_counter() - started
                done += count
                assert summary.as_dict()["handled"] == count, summary.as_dict()
            left_in_store = sum(len(page) for page in store.list())
            rejected = InboundEmail.objects.filter(reason="no_token").count()
            peak = database_size()
            ledger_peak = ledger_size()
            per_row = (peak - empty) / max(args.mails, 1)
            config = get_config()
            print(
                f"{args.mails} junk mails of {args.size_kib} KiB ({args.mails * size / 1e9:.2f} GB"
                f" in all), batches of {args.batch}; retention {config.retention_days:g} days, "
                f"rejected mail keeps {config.kept_raw_bytes} raw bytes"
            )
            print(f"  rejected no_token: {rejected}, still in the intake: {left_in_store}")
            print(
                f"  store baseline (write the files): {args.mails / write_s:8.1f} mails/s;"
                f" poll: {args.mails / poll_s:8.1f} mails/s ({poll_s:.1f} s)"
            )
            print(f"  database, empty ledger:           {mb(empty)}")
            print(
                f"  database at the peak (all kept):  {mb(peak)}  (ledger {mb(ledger_peak)};"
                f" {per_row / 1024:.1f} KiB a row)"
            )

            later = InboundEmail.objects.order_by("-finished_at").values_list(
                "finished_at", flat=True
            )[0] + timedelta(days=config.retention_days + 1)
            started = time.perf_counter()
            pruned = inbound_email_prune(now=later, max_seconds=3600)
            prune_s = time.perf_counter() - started
            after_prune = database_size()
            with connection.cursor() as cursor:
                cursor.execute("VACUUM inbound_email_inboundemail")
            after_vacuum = database_size()
            print(
                f"  pruning schedule, {config.retention_days + 1:g} days later: {pruned} rows"
                f" in {prune_s:.1f} s ({pruned / max(prune_s, 1e-9):.0f} rows/s)"
            )
            print(f"  database after the prune:         {mb(after_prune)}")
            print(f"  database after (auto)vacuum:      {mb(after_vacuum)}  (limit 200 MB)")
            heap, toast, indexes = ledger_parts()
            print(
                f"  ledger after vacuum: heap {mb(heap)}, TOAST {mb(toast)}, indexes {mb(indexes)}"
                " (index pages are free for reuse but stay allocated)"
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
                    " WHERE relname = 'inbound_email_inboundemail' ORDER BY 2 DESC LIMIT 4"
                )
                largest = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in cursor)
            print(f"  largest ledger indexes: {largest}")

            scale = args.full_mails / max(args.mails, 1)
            print(f"estimate for {args.full_mails} mails (x{scale:g}):")
            residue = (after_vacuum - empty) * scale  # grows with the rows once held
            print(
                f"  peak {mb(empty + per_row * args.full_mails)}; after prune + vacuum"
                f" {mb(empty + residue)} (the rows are gone; what stays is the empty schema"
                f" and the index pages they used, scaled x{scale:g});"
                f" poll {args.full_mails / (args.mails / poll_s) / 60:.0f} min,"
                f" prune {args.full_mails / max(pruned / max(prune_s, 1e-9), 1e-9) / 60:.1f} min"
            )
            steady = args.junk_per_day * config.retention_days * per_row
            print(
                f"steady state at {args.junk_per_day} junk mails a day: {mb(empty + steady)}"
                f" kept within the {config.retention_days:g}-day window"
            )
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
