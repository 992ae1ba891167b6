"""bench/jobs.py against earlier revisions, in the same run: is this checkout's runner as fast?

Usage (PostgreSQL as for bench/jobs.py; one database per checkout, created if needed):

    .venv/bin/python bench/jobs_against.py --rev 3e3ea5d [--rev f520b71] [--jobs 3000]
        [--rounds 3]

"No loss against today's figures in the same run" (issue 32, point 5) cannot be read off two
runs minutes apart on a shared machine: load drifts more than the difference looked for. This
script checks each `--rev` out into a temporary `git worktree`, then runs each checkout's own
`bench/jobs.py --rounds 1` in turn, round after round, the order rotating every round, each
against a database of its own (the checkouts' migrations differ). Every checkout runs in
this script's Python environment: the revisions compared must share the dependencies.

Printed per checkout and per runner line of bench/jobs.py: the median jobs/s and CPU µs/job
(worker, server) over the rounds, each round listed; then each revision's runner against this
checkout's: `runner, idempotent kind` here (a completion committed without the WAL flush, as
every completion was before issue 29) against a revision's line of the same name or, before
issue 29, its `jobs runner (run_pending)`. The worktrees are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAD = "this checkout"
# A row of bench/jobs.py's table: name, jobs/s, worker and server µs/job, the total (not
# printed by older revisions), then the rounds.
ROW = re.compile(
    r"^  (?P<name>\S.*?)\s{2,}(?P<rate>\d+)\s+(?P<worker>\d+)\s+(?P<server>\d+)"
    r"(?:\s+(?P<total>\d+))?\s+\d"
)
# The runner whose completions skip the WAL flush: the same work in every revision.
RUNNER_NAMES = ("runner, idempotent kind", "jobs runner (run_pending)")


@dataclass
class Figures:
    rate: list[float] = field(default_factory=list)
    worker_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)


@dataclass
class Checkout:
    label: str
    path: Path
    database_url: str
    rows: dict[str, Figures] = field(default_factory=dict)

    def run_round(self, jobs: int) -> None:
        env = {**os.environ, "DATABASE_URL": self.database_url}
        result = subprocess.run(
            [sys.executable, "bench/jobs.py", "--jobs", str(jobs), "--rounds", "1"],
            cwd=self.path,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            sys.exit(f"{self.label}: bench/jobs.py exited {result.returncode}:\n{result.stderr}")
        found = 0
        for line in result.stdout.splitlines():
            match = ROW.match(line)
            if match is None:
                continue
            found += 1
            figures = self.rows.setdefault(match["name"].strip(), Figures())
            figures.rate.append(float(match["rate"]))
            figures.worker_us.append(float(match["worker"]))
            figures.server_us.append(float(match["server"]))
        if not found:
            sys.exit(f"{self.label}: no figures in bench/jobs.py's output:\n{result.stdout}")

    def runner(self) -> Figures | None:
        return next((self.rows[name] for name in RUNNER_NAMES if name in self.rows), None)


def database_url(base: str, suffix: str) -> str:
    """`base` with its database name suffixed: each checkout migrates a database of its own."""
    head, _, name = base.rpartition("/")
    name, query_mark, query = name.partition("?")
    return f"{head}/{name}_{suffix}{query_mark}{query}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_figures(checkouts: list[Checkout]) -> None:
    for checkout in checkouts:
        print(f"{checkout.label}:")
        for name, figures in checkout.rows.items():
            rounds = ", ".join(f"{rate:.0f}" for rate in figures.rate)
            print(
                f"  {name:30}{median(figures.rate):8.0f} jobs/s"
                f"{median(figures.worker_us):8.0f} + {median(figures.server_us):.0f} µs/job"
                f"   rounds: {rounds}"
            )
    ours = checkouts[0].runner()
    if ours is None:
        sys.exit(f"{HEAD}: no line named one of {RUNNER_NAMES}")
    for checkout in checkouts[1:]:
        theirs = checkout.runner()
        if theirs is None:
            print(f"{checkout.label}: no runner line to compare")
            continue
        ours_cpu = median(ours.worker_us) + median(ours.server_us)
        theirs_cpu = median(theirs.worker_us) + median(theirs.server_us)
        rate_ratio = median(ours.rate) / median(theirs.rate)
        print(
            f"runner here / at {checkout.label}: jobs/s {rate_ratio:.2f}, "
            f"CPU per job {ours_cpu / theirs_cpu:.2f} (worker {median(ours.worker_us):.0f} "
            f"against {median(theirs.worker_us):.0f} µs, server {median(ours.server_us):.0f} "
            f"against {median(theirs.server_us):.0f} µs)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", action="append", required=True, help="a revision to compare")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/worker_bench")
    folder = Path(tempfile.mkdtemp(prefix="jobs-against-"))
    checkouts = [Checkout(HEAD, ROOT, database_url(base, "head"))]
    try:
        for rev in args.rev:
            path = folder / rev
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                check=True,
                capture_output=True,
            )
            sha = subprocess.run(
                ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            checkouts.append(Checkout(rev, path, database_url(base, sha)))
        print(f"before: {os.getloadavg()}")
        for round_no in range(args.rounds):
            shift = round_no % len(checkouts)
            for checkout in checkouts[shift:] + checkouts[:shift]:
                print(f"round {round_no + 1}: {checkout.label}", flush=True)
                checkout.run_round(args.jobs)
        print(f"after: {os.getloadavg()}")
        print(f"bench/jobs.py, {args.jobs} jobs x {args.rounds} rounds per checkout (medians)")
        print_figures(checkouts)
    finally:
        for checkout in checkouts[1:]:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout.path)],
                check=False,
            )
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
        if folder.exists() and not any(folder.iterdir()):
            folder.rmdir()


if __name__ == "__main__":
    main()
