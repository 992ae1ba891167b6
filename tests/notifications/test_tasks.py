"""The scheduled tasks (notifications/tasks.py): the paths the schedules name exist and run."""

from __future__ import annotations

import pytest

from notifications import tasks
from ops.schedules import SCHEDULES

pytestmark = pytest.mark.django_db


def test_scheduled_task_paths_exist_and_return_summaries(make_pi):
    make_pi()
    paths = [spec.func for spec in SCHEDULES if spec.func.startswith("notifications.")]
    assert paths == [
        "notifications.tasks.new_proposal_sweep",
        "notifications.tasks.proposal_review_sweep",
        "notifications.tasks.digest_sweep",
        "notifications.tasks.reply_rejected_notices",
    ]
    results = [getattr(tasks, path.rsplit(".", 1)[1])() for path in paths]
    assert [(r["sweep"], r["sent"]) for r in results] == [
        ("new_proposal", 1),
        ("proposal_review", 1),
        ("digest", 0),
        ("reply_rejected", 0),
    ]
