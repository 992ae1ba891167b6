"""Child processes whose host clock is skewed: Debian's libfaketime, preloaded.

A host whose clock is minutes off is what several hosts against one PostgreSQL look like to
each other. libfaketime shifts the wall clock a child process sees (time.time, datetime.now)
and leaves its monotonic clock alone; the database's clock is untouched. skewed_site/ works
around libfaketime's one failure there (time.sleep).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parent / "skewed_site"
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def skewed_env(env: dict[str, str], seconds: int) -> dict[str, str]:
    """`env` for a child whose wall clock runs `seconds` ahead (negative: behind)."""
    if not LIBFAKETIME.exists():
        pytest.fail(f"{LIBFAKETIME} is missing: install Debian's faketime (.ci/run does)")
    return {
        **env,
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH", "")])),
        "FAKETIME_NO_CACHE": "1",
    }


def skew_this_process(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process's wall clock (Django's `timezone.now`) `seconds` ahead of the database's,
    as a web or worker host whose clock is off sees it; the database's clock is untouched."""
    from datetime import timedelta

    from django.utils import timezone

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=seconds))
