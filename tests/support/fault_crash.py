"""The fault harness's fourth fault kind, `crash_after` (issue 37, point 5): PostgreSQL itself
stopped at once on a throwaway cluster (tests/support/throwaway_pg.py), then started again.

`crash_and_restart` is what the harness does when the proxy says the round trip came back;
`django_on_cluster` points the test process's Django connection at the cluster while a test
of the crash harness runs (its setup, reset and check read the cluster).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS

from tests.support.throwaway_pg import DATABASE as CLUSTER_DATABASE
from tests.support.throwaway_pg import ThrowawayCluster

STOP_SECONDS = 10  # pg_ctl's wait for an immediate stop (it takes well under one)


def crash_and_restart(cluster: ThrowawayCluster) -> None:
    """`pg_ctl stop -m immediate` (every server process killed, the WAL still in memory
    lost), then start it again (crash recovery)."""
    try:
        cluster.crash(timeout=STOP_SECONDS)
    except subprocess.SubprocessError as exc:
        # Seen when the proxy held a new connection's start-up packet during the crash
        # (a backend waiting for it outlived the postmaster's SIGQUIT): the postmaster had
        # not exited when pg_ctl gave up. Say what was running, then do what an immediate
        # stop does to every server process at once, with SIGKILL.
        print(f"pg_ctl stop -m immediate failed ({exc}):\n{_server_processes()}")
        _kill_server(cluster)
    for attempt in range(3):  # a start can fail while the old postmaster lets go
        try:
            cluster.start()
            return
        except subprocess.CalledProcessError as exc:
            log = (cluster.root / "server.log").read_text()[-2000:]
            print(f"the cluster did not start again ({exc}); server log:\n{log}")
            if attempt == 2:
                raise
            time.sleep(0.5)


@contextmanager
def django_on_cluster(cluster: ThrowawayCluster) -> Iterator[None]:
    """Point this thread's default Django connection at `cluster`'s database while the
    block runs, then back."""
    from django.db import connections

    conn = connections[DEFAULT_DB_ALIAS]
    saved = dict(conn.settings_dict)
    conn.close()
    # Django's pool (project/db_pool.py) connects with the parameters it was created with:
    # closed, the next query opens one with the cluster's (and, after the block, ours).
    conn.close_pool()
    conn.settings_dict.update(
        HOST="127.0.0.1", PORT=str(cluster.port), NAME=CLUSTER_DATABASE, USER="postgres",
        PASSWORD="",
    )  # fmt: skip
    try:
        yield
    finally:
        conn.close()
        conn.close_pool()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)


def _server_processes() -> str:
    return subprocess.run(
        ["ps", "-o", "pid,ppid,stat,wchan:20,args", "-u", "postgres"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout


def _kill_server(cluster: ThrowawayCluster) -> None:
    """SIGKILL the cluster's postmaster and every process it started; wait for them."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
    ).stdout.split()
    for pid in [postmaster, *map(int, children)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(postmaster, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
