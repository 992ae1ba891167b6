"""`--dist loadgroup` keeps an `xdist_group`'s tests on one worker again under pytest 9.2.

pytest-xdist 3.8 tells its controller a test's group by appending `@<group>` to the test's
node id in the worker (`item._nodeid = ...`). pytest 9.2 builds `item.nodeid` from a
structured id (`item._id`, a `_pytest.nodeid.NodeId`), so that assignment changes nothing:
no node id carries its group, and every grouped test is handed out alone, as if unmarked
(pytest-dev/pytest-xdist#1386; seen here as the fault tests setting up their harnesses on
all four workers, and earlier as the embedded-PostgreSQL tests of one group meeting on two).
This plugin, after pytest-xdist's own hook, gives each grouped test the suffixed id the
scheduler reads. Where pytest-xdist's assignment works (pytest < 9.2), it finds the suffix
there and does nothing. Registered by tests/conftest.py.
"""

from __future__ import annotations

import pytest
from _pytest.nodeid import NodeId


def group_suffix(item: pytest.Item) -> str:
    """`@<names>` as pytest-xdist spells a test's groups (sorted, joined by `_`), or ''."""
    names = {
        str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        for mark in item.iter_markers("xdist_group")
    }
    return "@" + "_".join(sorted(names)) if names else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set in an xdist worker only
        return
    for item in items:
        suffix = group_suffix(item)
        if suffix and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
