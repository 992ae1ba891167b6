"""Real OS processes: forked children and separate manage.py processes minting at once."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import select
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from django.db import connections
from django.utils import timezone

from canonical_ids import leases
from canonical_ids.exceptions import SlotUnavailable
from canonical_ids.minter import get_minter, parse_ts
from canonical_ids.models import Message, WriterSlotLease
from tests.support.processes import child_env, manage_py, spawn_manage_py, stop_process_group

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

COUNT = 2_000


class _CountConflicts(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", "") == "message_ts_conflict":
            self.count += 1


def _forked_recorder(run_id: str, author: str, go, conn) -> None:
    """Runs in a child forked from a parent that already holds a slot; says `ready`, then
    records once the parent sets `go`."""
    from canonical_ids import record_message

    result: dict = {"pid": os.getpid(), "inherited_slot": get_minter().slot}
    handler = _CountConflicts()
    logging.getLogger("canonical_ids.services").addHandler(handler)
    try:
        conn.send("ready")
        if not go.wait(180):
            raise TimeoutError("the parent never said go")
        for i in range(COUNT):
            record_message(run_id=run_id, text=f"m{i}", author=author, source="fork")
        result["slot"] = get_minter().slot
        get_minter().release()
    except Exception as exc:
        result["error"] = repr(exc)
    finally:
        connections.close_all()
    result["conflicts"] = handler.count
    conn.send(result)
    conn.close()


def test_forked_and_separate_processes_record_concurrently_without_collision(
    process_minter,
):
    """V11, acceptance 3: 2 forked + 2 manage.py processes x 2,000 messages into one run.

    Zero IntegrityErrors (no conflict retries either), zero duplicates, one distinct slot per
    process, none of them a fixed writer's (1, 2, 3), and the forks did not inherit the
    parent's slot.
    """
    run_id = "v11-concurrent"
    parent = process_minter()
    parent_slot = parent.acquire()
    env = child_env()

    connections.close_all()  # a forked child must not share the parent's database socket
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    forks = []
    for i in range(2):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_forked_recorder, args=(run_id, f"fork-{i}", go, sender))
        proc.start()
        forks.append((proc, receiver))
    commands = [
        spawn_manage_py(
            "mint_messages",
            "--run-id", run_id,
            "--count", str(COUNT),
            "--author", f"manage-{i}",
            "--start-on-stdin",
            env=env,
            stdin=subprocess.PIPE,
        )
        for i in range(2)
    ]  # fmt: skip

    # Every process starts recording at the same moment: once all of them are up, however
    # long a loaded machine takes to start a manage.py (a fixed instant 6 s ahead can pass first).
    for _proc, receiver in forks:
        assert receiver.poll(180), "forked recorder did not start"
        assert receiver.recv() == "ready"
    for command in commands:
        assert _read_line(command, 180).strip() == "ready"
    go.set()
    for command in commands:
        command.stdin.write("go\n")
        command.stdin.flush()

    results = []
    for proc, receiver in forks:
        assert receiver.poll(180), "forked recorder did not finish"
        results.append(receiver.recv())
        proc.join(10)
        assert proc.exitcode == 0
    for command in commands:
        out, err = command.communicate(timeout=180)
        assert command.returncode == 0, err
        assert "already taken" not in err  # no conflict retry happened
        results.append(json.loads(out.strip().splitlines()[-1]))

    for result in results[:2]:
        assert "error" not in result, result
        assert result["inherited_slot"] is None
        assert result["conflicts"] == 0
        assert result["slot"] != parent_slot

    rows = list(Message.objects.filter(run_id=run_id).values_list("author", "ts", "created_at"))
    assert len(rows) == 4 * COUNT
    assert len({ts for _, ts, _ in rows}) == 4 * COUNT
    residues: dict[str, set[int]] = defaultdict(set)
    spans: dict[str, list] = defaultdict(list)
    for author, ts, created_at in rows:
        residues[author].add(parse_ts(ts) % 100)
        spans[author].append(created_at)
    assert sorted(residues) == ["fork-0", "fork-1", "manage-0", "manage-1"]
    slots = [next(iter(r)) for r in residues.values() if len(r) == 1]
    assert len(slots) == 4, residues  # each process minted in exactly one slot
    assert len(set(slots)) == 4
    assert not set(slots) & {1, 2, 3}
    assert sorted(slots) == sorted(r["slot"] for r in results)
    # They really ran at the same time: every process started before any other finished.
    assert max(min(s) for s in spans.values()) < min(max(s) for s in spans.values())


def _read_line(proc, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout}s: {proc.stderr.read() if proc.poll() else ''}"
    return proc.stdout.readline()


def test_killed_process_slot_is_free_only_after_its_lease_expires():
    """V11, acceptance 5: SIGKILL leaves the lease; the slot is refused until expiry, then
    reused."""
    env = child_env(
        CANONICAL_IDS_WORKER_POOL="90",
        CANONICAL_IDS_LEASE_TTL="6",
        CANONICAL_IDS_RENEW_INTERVAL="1",
    )
    victim = spawn_manage_py(
        "mint_messages", "--run-id", "v11-kill", "--count", "1", "--hold", "120", env=env
    )
    try:
        report = json.loads(_read_line(victim, 60))
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
    assert report["slot"] == 90
    lease = WriterSlotLease.objects.get(slot=90)
    assert lease.holder_pid == victim.pid and lease.expires_at > timezone.now()

    holder = leases.Holder.current("worker", timezone.now())
    with pytest.raises(SlotUnavailable):
        leases.lease_acquire(slots=[90], holder=holder, ttl=6)

    time.sleep(max(0.0, (lease.expires_at - timezone.now()).total_seconds()) + 0.3)
    successor = manage_py("mint_messages", "--run-id", "v11-kill", "--count", "1", env=env)
    assert successor.returncode == 0, successor.stderr
    after = json.loads(successor.stdout.strip().splitlines()[-1])
    assert after["slot"] == 90
    assert after["first_ts"] > report["last_ts"]
    assert WriterSlotLease.objects.get(slot=90).holder_pid != victim.pid


def test_clean_exit_frees_the_slot_at_once_long_before_its_lease_would_expire():
    """A process that minted (so it claimed a slot) and exits cleanly gives the slot back on
    its way out (the atexit hook): the next process takes it at once, not after the lease's
    ten minutes, and carries on from the last id."""
    env = child_env(CANONICAL_IDS_WORKER_POOL="91", CANONICAL_IDS_LEASE_TTL="600")

    child = manage_py("mint_messages", "--run-id", "clean-exit", "--count", "1", env=env)

    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["slot"] == 91
    lease = WriterSlotLease.objects.get(slot=91)
    assert lease.holder_pid == report["pid"]  # it did hold the slot
    assert (lease.holder_token, lease.expires_at) == ("", None)  # and handed it back
    assert lease.last_ts == report["last_ts"]
    holder = leases.Holder.current("worker", timezone.now())
    taken = leases.lease_acquire(slots=[91], holder=holder, ttl=600)  # free now
    try:
        assert taken.slot == 91
    finally:
        leases.lease_release(slot=91, token=taken.token, last_ts=report["last_ts"])


def test_each_django_q2_worker_process_claims_its_own_slot():
    """I1: a real qcluster: its forked worker processes each hold a distinct pool slot at
    start-up."""
    env = child_env(Q_WORKERS="2", LOG_LEVEL="INFO")
    cluster = spawn_manage_py("qcluster", env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        holders: list[tuple[int, int]] = []
        while time.monotonic() < deadline and cluster.poll() is None:
            holders = list(
                WriterSlotLease.objects.filter(expires_at__gt=timezone.now(), role="worker")
                .exclude(holder_pid=os.getpid())
                .values_list("slot", "holder_pid")
            )
            if len(holders) >= 2:
                break
            time.sleep(0.5)
    finally:
        stop_process_group(cluster)
        err = cluster.stderr.read()
    assert len(holders) == 2, err[-3000:]
    slots = {slot for slot, _ in holders}
    pids = {pid for _, pid in holders}
    assert len(slots) == 2 and len(pids) == 2
    assert not slots & {1, 2, 3}
    assert "holds writer slot" in err
