"""How long scripts/test's whole run will take, said before it starts (issue 36, point 6).

A pytest plugin (tests/conftest.py registers it) and a small command for scripts/test:

    python -m tests.support.suite_clock estimate FILE WORKERS SEED
        print the expected duration: FILE's last passing run, else the budget
    python -m tests.support.suite_clock record FILE SECONDS PARALLEL_EXIT SERIAL_EXIT
        store "<seconds> <tests>" in FILE when both pytest calls passed

The plugin adds how many tests a pytest call ran to the file TEST_COUNT_FILE names (one line
per call; the xdist controller only, whose reports include its workers'), so the next
estimate can name the count of the run it comes from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# docs/setup.md: the whole suite's budget on a quiet 2-core machine.
BUDGET_SECONDS = 12 * 60
RAN = ("passed", "failed", "skipped", "xfailed", "xpassed")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    count_file = os.environ.get("TEST_COUNT_FILE")
    if not count_file or hasattr(config, "workerinput"):  # an xdist worker: the controller counts
        return
    ran = sum(len(terminalreporter.stats.get(outcome, [])) for outcome in RAN)
    with Path(count_file).open("a") as out:
        out.write(f"{ran}\n")


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s"


def estimate(last_run: Path, workers: str, seed: str) -> str:
    """The line scripts/test prints before it starts."""
    how = f"{workers} workers, then the timing-sensitive tests alone; random seed {seed}"
    try:
        seconds, tests = last_run.read_text().split()
    except (FileNotFoundError, ValueError):
        return (
            f"scripts/test: the whole suite ({how}): about {minutes(BUDGET_SECONDS)} on a "
            "quiet 2-core machine (its budget, docs/setup.md; no earlier run in "
            f"{last_run}); longer while other work runs"
        )
    return (
        f"scripts/test: the whole suite ({how}): about {minutes(float(seconds))}, as the last "
        f"whole run here ({tests} tests; budget {minutes(BUDGET_SECONDS)} on a quiet 2-core "
        "machine, docs/setup.md); longer while other work runs"
    )


def record(last_run: Path, seconds: str, parallel_exit: str, serial_exit: str) -> str:
    """Store the run's duration and test count if it passed; say what it took."""
    count_file = Path(os.environ.get("TEST_COUNT_FILE", ""))
    try:
        tests = sum(int(line) for line in count_file.read_text().split())
    except (FileNotFoundError, IsADirectoryError, ValueError):
        tests = 0
    if parallel_exit == "0" and serial_exit in ("0", "5") and tests:
        last_run.write_text(f"{seconds} {tests}\n")
    return f"scripts/test: {tests} tests in {minutes(float(seconds))}"


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "estimate":
        print(estimate(Path(argv[2]), argv[3], argv[4]), file=sys.stderr)
        return 0
    if len(argv) == 6 and argv[1] == "record":
        print(record(Path(argv[2]), *argv[3:]), file=sys.stderr)
        return 0
    print(
        "usage: python -m tests.support.suite_clock estimate FILE WORKERS SEED | "
        "record FILE SECONDS PARALLEL_EXIT SERIAL_EXIT",
        file=sys.stderr,
    )
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
