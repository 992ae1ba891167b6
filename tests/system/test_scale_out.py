"""The scale-out rehearsal (issue 22.6): three clusters through PgBouncer in transaction
pooling, two of them with clocks 5 minutes ahead and behind, LISTEN direct; 5,000 jobs,
500 mails and a notification sweep. Every job completes once, every mail is handled once,
and no id is minted twice. The scenario is tests/support/scale_out.py; bench/scale_out.py
runs it on a database of its own and prints the same table."""

from __future__ import annotations

import pytest

from tests.support.scale_out import ScaleOut, ScaleOutSettings

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_three_clusters_through_pgbouncer_with_skewed_clocks_do_everything_once(tmp_path):
    report = ScaleOut(ScaleOutSettings(jobs=5000, mails=500, skews=(0, 300, -300)), tmp_path).run()
    print(report.table())

    assert report.done, report.table()
    assert not report.failed, report.table()
