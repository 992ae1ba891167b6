"""Benchmark of sending at the account's pace (issue 23.1), against a local SES that enforces
a token bucket and a daily quota as SES does (tests/support/ses_limits.py).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker .venv/bin/python bench/ses_pacing.py \
        [--notices 1000] [--rate 14] [--quota 300] [--baseline 200]

Creates a throwaway database (test_<name>, dropped at the end) and runs the new_proposal
sweep, one cycle after another until nothing is left to send, in this process:

  unpaced   the first --baseline notices with the pace switched off (NOTIFICATION_SEND_RATE
            far above the limit): what the sweep did before, bar botocore's retries
  paced     --notices notices, the rate read from GetSendQuota: elapsed against the ideal
            notices/rate, throttled calls, failed rows
  quota     --notices notices over a daily quota of --quota: how many sent, waiting
            `pending`, failed, and how many SES calls were refused for the quota
  2 sweeps  (--concurrent N) N PIs, the new_proposal and proposal_review sweeps at once in
            two threads with their own database sessions: 2N mails through one shared bucket

Acceptance (issue 23): paced within 1.3x the ideal, under 1 % throttled, none failed; over the
quota, the rest wait `pending`, none failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for name, value in {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}.items():
    os.environ[name] = value

from bench.support import setup_django_like_production  # noqa: E402

setup_django_like_production()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from notifications.models import (  # noqa: E402
    EmailNotification,
    NotificationPreference,
    Proposal,
    SendingState,
)
from notifications.sweeps import run_sweep  # noqa: E402
from tests.support.ses_limits import SesLimits  # noqa: E402

Status = EmailNotification.Status
SWEEPS_AT_ONCE = ("new_proposal", "proposal_review")


def _populate(count: int) -> None:
    User = get_user_model()
    EmailNotification.objects.all().delete()
    Proposal.objects.all().delete()
    NotificationPreference.objects.all().delete()
    User.objects.all().delete()
    SendingState.objects.all().delete()
    User.objects.bulk_create(
        [
            User(username=f"bench{i}", email=f"bench{i}@example.org", password="!")
            for i in range(count)
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


def _sweep_until_done(max_cycles: int = 20) -> dict:
    """Run cycles until one sends nothing (the sweep's schedule, without the minute between)."""
    totals = {"sent": 0, "failed": 0, "throttled": 0, "held": 0, "cycles": 0}
    for _ in range(max_cycles):
        summary = run_sweep("new_proposal")
        totals["cycles"] += 1
        for key in ("sent", "failed", "throttled", "held"):
            totals[key] += getattr(summary, key)
        if not summary.sent:
            break
    return totals


def _two_sweeps_at_once() -> dict:
    """The new_proposal and proposal_review sweeps in two threads at once (each its own
    database session and Pacer, as two worker processes): they share one bucket."""
    results: dict[str, dict] = {}

    def run(kind: str) -> None:
        try:
            totals = {"sent": 0, "failed": 0, "throttled": 0, "held": 0, "cycles": 0}
            for _ in range(20):
                summary = run_sweep(kind)
                totals["cycles"] += 1
                for key in ("sent", "failed", "throttled", "held"):
                    totals[key] += getattr(summary, key)
                if not summary.sent:
                    break
            results[kind] = totals
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(kind,)) for kind in SWEEPS_AT_ONCE]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        key: sum(r[key] for r in results.values())
        for key in ("sent", "failed", "throttled", "held", "cycles")
    }


def _statuses() -> dict[str, int]:
    counts = {}
    for status in Status.values:
        n = EmailNotification.objects.filter(status=status).count()
        if n:
            counts[status] = n
    return counts


def _scenario(
    label: str,
    *,
    notices: int,
    rate: float,
    quota: int | None,
    override: float,
    concurrent: bool = False,
) -> dict:
    _populate(notices)
    mails = 2 * notices if concurrent else notices  # two sweeps: a notice and a review each
    with (
        SesLimits(rate=rate, daily_quota=quota) as ses,
        override_settings(
            EMAIL_SENDER="ses",
            NOTIFICATION_SEND_RATE=override,
            NOTIFICATION_THROTTLE_RETRY_SECONDS=1,
        ),
    ):
        os.environ["AWS_ENDPOINT_URL"] = ses.url
        started = time.perf_counter()
        totals = _two_sweeps_at_once() if concurrent else _sweep_until_done()
        seconds = time.perf_counter() - started
        ideal = min(mails, quota or mails) / rate
        calls = ses.calls
        row = {
            "label": label,
            "accepted": len(ses.accepted),
            "seconds": seconds,
            "ideal": ideal,
            "throttled_calls": ses.throttled_rate,
            "quota_refused_calls": ses.throttled_quota,
            "calls": calls,
            "statuses": _statuses(),
            **totals,
        }
    os.environ.pop("AWS_ENDPOINT_URL", None)
    share = 100 * row["throttled_calls"] / max(calls, 1)
    print(
        f"{label:<8} mails={mails:>5} accepted={row['accepted']:>5} "
        f"{seconds:7.1f}s (ideal {ideal:6.1f}s, {seconds / ideal:4.2f}x) "
        f"calls={calls:>5} throttled={row['throttled_calls']:>4} ({share:.2f} %) "
        f"quota-refused={row['quota_refused_calls']} cycles={row['cycles']} "
        f"rows={row['statuses']}",
        flush=True,
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notices", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=14.0)
    parser.add_argument("--quota", type=int, default=300)
    parser.add_argument("--baseline", type=int, default=200)
    parser.add_argument(
        "--concurrent", type=int, default=0, help="PIs for the two-sweeps-at-once run (0: none)"
    )
    args = parser.parse_args()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        print(f"local SES: {args.rate:g}/s token bucket; PostgreSQL; one sweep process")
        if args.baseline:
            _scenario("unpaced", notices=args.baseline, rate=args.rate, quota=None, override=1e6)
        paced = _scenario("paced", notices=args.notices, rate=args.rate, quota=None, override=0)
        quota = _scenario(
            "quota", notices=args.notices, rate=args.rate, quota=args.quota, override=0
        )
        if args.concurrent:
            both = _scenario(
                "2 sweeps",
                notices=args.concurrent,
                rate=args.rate,
                quota=None,
                override=0,
                concurrent=True,
            )
            print(
                f"two sweeps at once: {both['seconds'] / both['ideal']:.2f}x ideal, "
                f"{both['throttled_calls']} throttled, "
                f"{both['statuses'].get(Status.FAILED, 0)} failed (one shared bucket)"
            )
        ratio = paced["seconds"] / paced["ideal"]
        share = paced["throttled_calls"] / max(paced["calls"], 1)
        failed = paced["statuses"].get(Status.FAILED, 0)
        waiting = quota["statuses"].get(Status.PENDING, 0) + (
            args.notices - sum(quota["statuses"].values())
        )
        print(
            f"paced: {ratio:.2f}x ideal (limit 1.30), {100 * share:.2f} % throttled (limit 1 %), "
            f"{failed} failed; quota {args.quota}: {quota['accepted']} sent, {waiting} waiting "
            f"(pending or not yet due), {quota['statuses'].get(Status.FAILED, 0)} failed"
        )
        ok = ratio <= 1.3 and share < 0.01 and failed == 0
        ok = ok and quota["accepted"] == args.quota and not quota["statuses"].get(Status.FAILED)
        print("acceptance:", "met" if ok else "NOT met")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
