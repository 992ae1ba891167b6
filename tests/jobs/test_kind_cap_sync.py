"""The caps of `@handler(kind, concurrency=N)` reach the database (issue 37, point 2): a
bad cap is refused at registration, naming the kind; each worker writes its registry's caps
to `jobs_kindcap` at start-up, corrects a changed one, removes the row of a kind its code
has no cap for, and says what changed."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs import handler
from jobs.kind_caps import kind_caps_line, kind_caps_sync
from jobs.models import KindCap
from jobs.registry import kind_caps
from tests.jobs.handlers import CAPPED_CONCURRENCY, CAPPED_KIND, CAPPED_ONE_KIND


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_a_cap_that_is_not_a_positive_whole_number_is_refused_naming_the_kind(bad):
    with pytest.raises(ImproperlyConfigured, match=r"'tests\.bad_cap'.*concurrency="):

        @handler("tests.bad_cap", concurrency=bad)
        def bad_cap(payload: dict) -> None:
            pass


def test_the_registry_knows_each_kinds_cap_and_only_capped_kinds():
    caps = kind_caps()
    assert caps[CAPPED_KIND] == CAPPED_CONCURRENCY
    assert caps[CAPPED_ONE_KIND] == 1
    assert "tests.noop" not in caps


def _table() -> dict[str, int]:
    return dict(KindCap.objects.values_list("kind", "concurrency"))


@pytest.mark.django_db(transaction=True)
def test_the_start_up_sync_makes_the_table_what_the_code_says_and_logs_each_change(caplog):
    KindCap.objects.create(kind="tests.no_such_handler", concurrency=4)  # left behind
    KindCap.objects.create(kind=CAPPED_KIND, concurrency=9)  # an older release's cap
    with caplog.at_level(logging.INFO, logger="jobs.kind_caps"):
        changes = kind_caps_sync()
    assert _table() == kind_caps()
    assert sorted(str(change) for change in changes) == [
        f"{CAPPED_KIND} {CAPPED_CONCURRENCY} (was 9)",
        f"{CAPPED_ONE_KIND} 1 (new)",
        "tests.no_such_handler removed (was 4)",
    ]
    assert "job caps changed: " in caplog.text
    assert "tests.no_such_handler removed (was 4)" in caplog.text
    assert "changed: " in kind_caps_line(changes)

    caplog.clear()
    assert kind_caps_sync() == []  # a second start changes nothing
    assert _table() == kind_caps()
    assert "job caps changed" not in caplog.text
    assert kind_caps_line([]).endswith("(unchanged)")
