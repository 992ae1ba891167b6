"""Benchmark of canonical-id minting: one process, the per-slot ceiling, and N processes.

    DATABASE_URL=postgres://... .venv/bin/python bench/mint.py [--processes 4] [--seconds 2]
        [--messages 1000]

Prints, for the configured database:
  * the arithmetic alone (TsMinter, clock never the limit): the CPU cost of an id;
  * mint_ts() in one process with its leased slot, for SECONDS: bounded by the per-slot
    ceiling MICROS / WRITER_SLOT_MODULUS = 10,000 ids/s (a used-up tick waits for the next);
  * mint_ts() in N forked processes at once, each with its own leased slot: the aggregate;
  * record_message() in one process and in N processes at once (database-bound).
Rows it writes go to run ids "bench-*" and are deleted at the end; leases are released.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connections  # noqa: E402

from canonical_ids import mint_ts, record_message  # noqa: E402
from canonical_ids.minter import MICROS, TsMinter, get_minter, parse_ts  # noqa: E402
from canonical_ids.models import Message  # noqa: E402


def bench_arithmetic(count: int) -> float:
    """ids/s of TsMinter alone; a fake clock jumps to the next tick whenever one is used up."""
    now = [time.time()]
    minter = TsMinter(4, time_source=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    start = time.perf_counter()
    for _ in range(count):
        minter.next_value()
    return count / (time.perf_counter() - start)


def mint_for(seconds: float) -> tuple[int, float, int, set[int], int]:
    """mint_ts() in a loop for `seconds`: (ids, elapsed, distinct, slots, busiest tick)."""
    mint_ts()  # claim the slot outside the timed loop
    ids = []
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(500):
            ids.append(mint_ts())
    elapsed = time.perf_counter() - start
    busiest = max(Counter(t.split(".")[0] for t in ids).values())
    return len(ids), elapsed, len(set(ids)), {parse_ts(t) % 100 for t in ids}, busiest


def record_n(run_id: str, count: int) -> tuple[int, float]:
    record_message(run_id=run_id, text="warm-up", author="bench", source="bench")
    start = time.perf_counter()
    for i in range(count):
        record_message(run_id=run_id, text=f"m{i}", author="bench", source="bench")
    return count, time.perf_counter() - start


def _child(kind: str, arg, conn) -> None:
    try:
        if kind == "mint":
            n, elapsed, distinct, slots, _ = mint_for(arg)
            conn.send((n, elapsed, distinct, sorted(slots), None))
        else:
            n, elapsed = record_n(f"bench-{os.getpid()}", arg)
            conn.send((n, elapsed, n, [get_minter().slot], None))
        get_minter().release()
    except Exception as exc:
        conn.send((0, 0.0, 0, [], repr(exc)))
    finally:
        connections.close_all()
        conn.close()


def in_processes(kind: str, arg, processes: int) -> list[tuple]:
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    running = []
    for _ in range(processes):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(kind, arg, sender))
        proc.start()
        running.append((proc, receiver))
    results = []
    for proc, receiver in running:
        results.append(receiver.recv())
        proc.join(30)
    errors = [r[4] for r in results if r[4]]
    if errors:
        raise SystemExit(f"child failed: {errors}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--messages", type=int, default=1000)
    args = parser.parse_args()
    ceiling = MICROS // settings.WRITER_SLOT_MODULUS
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(f"database: {db}; cpus: {os.cpu_count()}; role: {settings.CANONICAL_IDS_ROLE}")
    print(
        f"per-slot ceiling:            {ceiling:>12,} ids/s (1e6 / {settings.WRITER_SLOT_MODULUS})"
    )
    arith = bench_arithmetic(200_000)
    print(f"arithmetic only (no ceiling): {arith:>12,.0f} ids/s  (baseline: CPU cost of an id)")

    n, elapsed, distinct, slots, busiest = mint_for(args.seconds)
    one = n / elapsed
    print(
        f"mint_ts, 1 process:          {one:>12,.0f} ids/s  ({n:,} ids, {distinct:,} distinct, "
        f"slot {sorted(slots)}; busiest tick {busiest:,} ids; a partial first tick can "
        "still hold 10,000, so short runs read a little above the ceiling)"
    )
    results = in_processes("mint", args.seconds, args.processes)
    total = sum(r[0] for r in results)
    wall = max(r[1] for r in results)
    all_slots = [s for r in results for s in r[3]]
    print(
        f"mint_ts, {args.processes} processes:        {total / wall:>12,.0f} ids/s aggregate "
        f"({total:,} ids, slots {sorted(all_slots)}, "
        f"per process {', '.join(f'{r[0] / r[1]:,.0f}' for r in results)})"
    )

    try:
        n, elapsed = record_n("bench-parent", args.messages)
        print(f"record_message, 1 process:   {n / elapsed:>12,.0f} msgs/s ({n:,} messages)")
        results = in_processes("record", args.messages, args.processes)
        total = sum(r[0] for r in results)
        wall = max(r[1] for r in results)
        print(
            f"record_message, {args.processes} processes: {total / wall:>12,.0f} msgs/s aggregate "
            f"({total:,} messages, slots {sorted(s for r in results for s in r[3])})"
        )
    finally:
        Message.objects.filter(run_id__startswith="bench-").delete()
        get_minter().release()


if __name__ == "__main__":
    main()
