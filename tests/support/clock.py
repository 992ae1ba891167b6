"""A wall clock the canonical_ids tests move by hand."""

from __future__ import annotations


class FakeClock:
    """A wall clock the test moves by hand; sleeping advances it (and is recorded)."""

    def __init__(self, start: float = 1_785_421_880.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.mono = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.mono += seconds

    def monotonic(self) -> float:
        return self.mono
