"""The chaos test: the soak of bench/soak.py, short enough for CI (see tests/support/chaos.py).

Two qclusters on PostgreSQL with S3/SES (moto, server mode) and the local Slack server; for
40 s, workers holding a job are SIGKILLed, one cluster's database sessions are terminated
(`pg_terminate_backend`) and Slack answers 429/500/slowly, while jobs arrive from Django and
from plain SQL, PIs are mailed about new proposals and their replies land in the intake.
Once quiet: every job completed once (or failed with a reason), no live job was reaped,
every mail is final and out of the intake, no notification phantom-sent or lost, every
instruction posted exactly once (counted from the Slack server's kept channel messages by the
reply id in their metadata) or inboxed, never both, no writer slot held by two live
processes.

Slack's slow answers come after the client's SLACK_TIMEOUT (10 s, its minimum), so posts
land and the worker is not told: the relay must find them in `conversations.history`
instead of posting again, as it must after a 500 or a worker SIGKILLed between its post and
its record.
"""

from __future__ import annotations

import pytest

from tests.support.chaos import ChaosRun, ChaosSettings

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_chaos_two_clusters_keep_every_invariant(tmp_path):
    # Usually quiet within seconds. The timeout covers the slowest legitimate recovery: a
    # poll whose connection dies just as its claim commits leaves that mail claimed for
    # inbound_email's CLAIM_LEASE_SECONDS (600 s) before another poll takes it.
    report = ChaosRun(ChaosSettings(seconds=40, quiet_timeout=660, seed=11), tmp_path).run()
    print(report.table())

    assert report.settled, report.table()
    assert report.faults.get("SIGKILL of a worker holding a job", 0) >= 1, report.table()
    assert report.faults.get("  sessions terminated", 0) >= 1, report.table()
    assert not report.failed, report.table()
