"""Benchmark of the notification sweeps: users/s and database queries per user.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/sweeps.py \
        [--users 10000] [--batch-size 500]

Creates a throwaway database (test_<name>, dropped at the end), N users each the PI of one
proposal in review, and runs, with SES mocked by moto in-process:

  baseline      new_proposal sweep with Django's locmem backend (no SES): the DB-side cost
  new_proposal  the same sweep sending through SES (moto)
  review        proposal_review sweep: one review request per user
  expiry        proposal_review 73 h later: every request expires (ladder count +1), re-asked
  idle          new_proposal again: nothing due
  digest        all users on the daily rung: one digest each

Queries are counted with CaptureQueriesContext; "q/user" divides by the users visited.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
for name, value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[name] = value
os.environ.pop("AWS_ENDPOINT_URL", None)
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

import boto3  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from django.utils import timezone  # noqa: E402
from moto import mock_aws  # noqa: E402

from notifications.models import EmailNotification, NotificationPreference, Proposal  # noqa: E402
from notifications.senders.django import DjangoEmailSender  # noqa: E402
from notifications.sweeps import run_sweep  # noqa: E402


def _populate(users: int) -> None:
    User = get_user_model()
    User.objects.bulk_create(
        [
            User(username=f"bench{i}", email=f"bench{i}@example.org", password="!")
            for i in range(users)
        ],
        batch_size=2000,
    )
    Proposal.objects.bulk_create(
        [
            Proposal(pi_id=pk, title=f"Proposal of {pk}", status=Proposal.Status.IN_REVIEW)
            for pk in User.objects.values_list("pk", flat=True)
        ],
        batch_size=2000,
    )


class _QueryCounter:
    """Counts every statement the connection executes (SAVEPOINTs included), unbounded."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def _run(label: str, kind: str, **kwargs) -> dict:
    counter = _QueryCounter()
    with connection.execute_wrapper(counter):
        started = time.perf_counter()
        summary = run_sweep(kind, **kwargs)
        seconds = time.perf_counter() - started
    captured = range(counter.count)
    users = max(summary.users, 1)
    row = {
        "label": label,
        "users": summary.users,
        "sent": summary.sent,
        "expired": summary.expired,
        "errors": summary.errors,
        "seconds": seconds,
        "users_per_s": summary.users / seconds if seconds else 0.0,
        "queries": len(captured),
        "q_per_user": len(captured) / users,
    }
    print(
        f"{label:<13} users={row['users']:>6} sent={row['sent']:>6} expired={row['expired']:>6} "
        f"errors={row['errors']} {seconds:7.2f}s {row['users_per_s']:8.0f} users/s "
        f"queries={row['queries']:>6} "
        + (f"({row['q_per_user']:.2f}/user)" if summary.users else "(no user visited)"),
        flush=True,
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=settings.NOTIFICATION_SWEEP_BATCH_SIZE)
    args = parser.parse_args()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        _populate(args.users)
        print(f"{args.users} users, batch size {args.batch_size}, PostgreSQL, SES = moto")
        t0 = timezone.now()
        common = {"batch_size": args.batch_size}
        with override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"):
            baseline = _run(
                "baseline", "new_proposal", now=t0, sender=DjangoEmailSender(), **common
            )
        EmailNotification.objects.all().delete()
        # moto reports a sandbox account (1 mail/s): this bench measures the sweep, not the pace
        # (bench/ses_pacing.py does).
        with (
            mock_aws(),
            override_settings(
                EMAIL_SENDER="ses", SES_REGION="us-east-1", NOTIFICATION_SEND_RATE=1e6
            ),
        ):
            client = boto3.client("ses", region_name="us-east-1")
            client.verify_email_identity(EmailAddress="assistant@localhost")
            client.verify_domain_identity(Domain="reply.localhost")  # the envelope senders
            ses = _run("new_proposal", "new_proposal", now=t0, **common)
            _run("review", "proposal_review", now=t0, **common)
            _run("expiry", "proposal_review", now=t0 + timedelta(hours=73), **common)
            _run("idle", "new_proposal", now=t0 + timedelta(hours=74), **common)
            NotificationPreference.objects.all().update(rung=NotificationPreference.Rung.DAILY)
            _run("digest", "digest", now=t0 + timedelta(hours=75), **common)
        print(
            f"SES (moto) costs {baseline['users_per_s'] / max(ses['users_per_s'], 1e-9):.1f}x "
            "the locmem baseline's time per user; queries per user are the same "
            f"({baseline['q_per_user']:.2f} vs {ses['q_per_user']:.2f})"
        )
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
