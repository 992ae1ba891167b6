"""`register`: a fixture that registers handlers for one test and forgets them after it.

The registry (jobs/registry.py) keeps a kind's settings in several module-level tables (the
handler, its caps, rates, reserved slots, timeouts, and the sets of idempotent, async and
context-taking kinds). Restoring a copy of every one of them, rather than popping the kind
from the tables one remembers, leaves nothing behind when the registry gains a table.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest

from jobs import registry
from jobs.registry import handler


def _tables() -> dict[str, object]:
    return {
        name: value
        for name, value in vars(registry).items()
        if name.startswith("_") and not name.startswith("__") and isinstance(value, dict | set)
    }


@pytest.fixture
def register() -> Iterator[Callable[..., Callable]]:
    """`register(kind, **options)(fn)`: `@handler` for this test only."""
    # Discovery first: the tables saved must hold what discovery registers. Where this
    # fixture was the first to touch the registry of its process, the test's run discovered
    # our apps' handlers, the restore dropped them and discovery, done once per process,
    # never brought them back: every later test there found no `inbound_email.relay_reply`.
    registry.discover()
    saved = {name: copy.copy(table) for name, table in _tables().items()}
    yield handler
    for name, table in _tables().items():
        table.clear()  # in place: other modules hold these objects
        table.update(saved[name])  # type: ignore[attr-defined]
