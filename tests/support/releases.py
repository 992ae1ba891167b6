"""The previous release's code, checked out beside this one, for rolling-deploy tests.

A release is a commit of main; "the previous release" is the commit before the newest one
that added a migration (so the test keeps following as releases come). It is computed with
git on the first-parent line (a merge that brought migrations counts as that commit), which
needs the full history (CI clones it whole).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import PROJECT_ROOT

MIGRATIONS = "*/migrations/[0-9]*.py"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def newest_migration_commit() -> str:
    """The newest commit on HEAD's first-parent line that added a migration file."""
    found = _git(
        "log", "-1", "--first-parent", "--diff-filter=A", "--format=%H", "HEAD", "--", MIGRATIONS
    )
    if not found:
        raise RuntimeError("no commit adds a migration: is the clone shallow?")
    return found


def previous_release() -> str:
    """The commit before the newest migration: the code a rolling deploy replaces."""
    return _git("rev-parse", f"{newest_migration_commit()}^1")


def commit_before_adding(path: str) -> str:
    """The commit before the one that added `path` (a pinned earlier release)."""
    added = _git("log", "-1", "--diff-filter=A", "--format=%H", "HEAD", "--", path)
    if not added:
        raise RuntimeError(f"no commit adds {path}")
    return _git("rev-parse", f"{added}^1")


@contextmanager
def checkout(commit: str, where: Path) -> Iterator[Path]:
    """A detached `git worktree` of `commit` at `where`, removed afterwards."""
    _git("worktree", "add", "--detach", "--force", str(where), commit)
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "worktree", "remove", "--force", str(where)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        _git("worktree", "prune")
