"""The chaos test: the soak of bench/soak.py, short enough for CI (see tests/support/chaos.py).

Two qclusters on PostgreSQL with S3/SES (moto, server mode) and the local Slack server; for
40 s, workers holding a job are SIGKILLed, one cluster's database sessions are terminated
(`pg_terminate_backend`) and Slack answers 429/500/slowly, while jobs arrive from Django and
from plain SQL, PIs are mailed about new proposals and their replies land in the intake.
Once quiet: every job completed once (or failed with a reason), no live job was reaped,
every mail is final and out of the intake, no notification phantom-sent or lost, every
instruction posted or inboxed, no writer slot held by two live processes.

Instructions are asserted "at least once, never lost": the Slack post still runs inside the
relay job's transaction, so a worker killed (or a post that times out) after Slack accepted
it posts it again; the duplicates are reported as a figure, not asserted (issue 10 point 3
moves the post out of the transaction).
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
