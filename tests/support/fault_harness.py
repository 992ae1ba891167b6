"""Every database round trip of a scenario, faulted one at a time (issue 30, invariant I22).

A scenario is one pass of a loop (a drain, a poll, a relay, a sweep, minting) over rows the
test made. The harness runs it once without a fault through `pg_faults.FaultProxy`, which
records every round trip of every connection the process opens. Then, for each recorded
round trip and each fault kind (error before; lost answer, for a round trip after which the
server was idle, i.e. committed; kill after), it starts over on a fresh database: setup,
the pass with that one fault, recovery as a fresh process would do it (the reaper, the next
poll, the next sweep; no fault), and the scenario's invariants. A harness made with a
`ThrowawayCluster` (tests/support/throwaway_pg.py) runs on that cluster instead of the test
database, and can fault a fourth way: `crash_after`, PostgreSQL itself stopped with
`pg_ctl stop -m immediate` right after the round trip, then started again (issue 37,
point 5; the runner's scenarios). Each pass runs in a child
forked from `fault_child`'s fork server, so a kill is a real SIGKILL of a real process.

Nothing of ours is mocked: the code under test talks to the real test database through the
proxy, which only withholds or cuts bytes.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection

from tests.support.fault_crash import CLUSTER_DATABASE, crash_and_restart
from tests.support.fault_report import assert_held, report, summarize, table
from tests.support.pg_faults import (
    CRASH_AFTER,
    ERROR_BEFORE,
    FAULT_KINDS,
    KILL_AFTER,
    LOST_ANSWER,
    Fault,
    FaultProxy,
    RoundTrip,
)
from tests.support.processes import PROJECT_ROOT, child_env
from tests.support.throwaway_pg import ThrowawayCluster

FIRED_FILE = "fault-fired"  # made in a run's folder when its fault cuts a connection
RUN_TIMEOUT = 60.0  # seconds one phase of one run may take before it counts as hung
# Seconds the fork server may take to answer with a child's pid: a hang guard, no measure.
# 10 s was missed beside three other xdist workers on a loaded 2-core machine (issue 36).
FORK_TIMEOUT = 60.0


class Scenario:
    """One pass of a loop and its invariants. `setup` and `check` run in the test process
    (straight to the database); `run` and `recover` in a forked child, through the proxy,
    with `settings` applied (`override_settings`, so the apps' cached configs follow)."""

    name = ""
    settings: dict[str, Any] = {}
    # Settings of the pass alone, over `child_settings`: a claim's timeout the pass must send
    # within, long enough that a loaded machine (four xdist workers on two cores) does not
    # hand its claims back before the faulted round trip comes ("a fault never fired");
    # recovery, a fresh process, keeps the short one, so it takes the claims over at once
    # (what it would do once they timed out) instead of sleeping for them.
    run_settings: dict[str, Any] = {}

    def setup(self, workdir: Path) -> dict[str, Any]:
        raise NotImplementedError

    def run(self, ctx: dict[str, Any]) -> None:
        raise NotImplementedError

    def recover(self, ctx: dict[str, Any]) -> None:
        raise NotImplementedError

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        """The invariants after recovery: one line per violation (`killed_pid`: the pass's
        process, if the fault SIGKILLed it; after a `crash_after`, `ctx["crash"]` holds the
        pass's `pid` and the `at` (time.time()) the server was stopped)."""
        raise NotImplementedError

    def child_settings(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return dict(self.settings)

    def crash_snapshot(self, conn: Any) -> Any:
        """For `crash_after`: what to keep of the database (a psycopg connection of the
        harness's own, autocommit) right before the crash and right after the restart;
        `check` finds both in `ctx["crash"]` (`before`, `after`). JSON, or None."""
        return None

    def in_child(self, phase: str, ctx: dict[str, Any]) -> None:
        from django.test.utils import override_settings

        settings = {**self.child_settings(ctx), **(self.run_settings if phase == "run" else {})}
        with override_settings(**settings):
            getattr(self, phase)(ctx)


def load_scenario(path: str) -> Scenario:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class Outcome:
    scenario: str
    fault: Fault | None
    trip: RoundTrip | None  # the faulted round trip as recorded by the clean run
    fired: bool
    exit: int | None  # the faulted pass's exit code (-9: killed), None: hung
    violations: list[str] = field(default_factory=list)
    log: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # per step: setup, run, ...

    @property
    def result(self) -> str:
        if self.violations:
            return "VIOLATION: " + "; ".join(self.violations)
        return "ok" if self.fired or self.fault is None else "ok (not reached)"


class FaultHarness:
    """The proxy, the fork server and a fresh database per run. Use as a context manager
    inside a `django_db(transaction=True)` test (it truncates the test database)."""

    def __init__(
        self,
        *,
        modules: Iterable[str],
        workdir: Path,
        env: dict[str, str] | None = None,
        cluster: ThrowawayCluster | None = None,
    ):
        self.workdir = workdir
        self.modules = list(modules)
        self.extra_env = env or {}
        self.cluster = cluster
        self._crashed_at: float | None = None
        if cluster is not None:
            self.proxy = FaultProxy("127.0.0.1", cluster.port)
        else:
            params = connection.settings_dict
            self.proxy = FaultProxy(
                params.get("HOST") or "127.0.0.1", int(params.get("PORT") or 5432)
            )
        self._zygote: subprocess.Popen | None = None
        self._buffer = b""
        self._pid: int | None = None
        self._pid_known = threading.Event()
        self._runs = 0

    def __enter__(self) -> FaultHarness:
        self.proxy.__enter__()
        if self.cluster is not None:
            url = f"postgres://postgres@127.0.0.1:{self.proxy.port}/{CLUSTER_DATABASE}"
        else:
            params = connection.settings_dict
            url = f"postgres://{params['USER']}@127.0.0.1:{self.proxy.port}/{params['NAME']}"
        env = child_env(DATABASE_URL=url, PGSSLMODE="disable", PGGSSENCMODE="disable")
        env.update(self.extra_env)
        self._stderr = open(self.workdir / "fork-server.log", "ab")  # noqa: SIM115 - closed in __exit__
        self._zygote = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fault_child", *self.modules],
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._zygote is not None:
            self._zygote.stdin.close()
            try:
                self._zygote.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._zygote.kill()
                self._zygote.wait(timeout=10)
            self._stderr.close()
        self.proxy.__exit__(*exc)

    # --- one run ------------------------------------------------------------------------

    def attempt(
        self, scenario: Scenario, fault: Fault | None = None, trip: RoundTrip | None = None
    ) -> tuple[Outcome, list[RoundTrip]]:
        """Fresh database, setup, the pass (with `fault`), recovery, the invariants."""
        self._runs += 1
        clock = _Stopwatch()
        rundir = self.workdir / f"{scenario.name}-{self._runs}"
        rundir.mkdir(parents=True)
        log = rundir / "child.log"
        reset_database()
        fired_file = rundir / FIRED_FILE
        ctx = scenario.setup(rundir)
        clock.lap("setup")
        self._crashed_at = None
        self._crash_snapshots: dict[str, Any] = {}
        self._scenario = scenario
        self.proxy.begin(
            fault,
            on_kill=self._kill,
            on_fire=fired_file.touch,
            on_crash=self._crash if self.cluster is not None else None,
        )
        code = self._phase(scenario, "run", ctx, log)
        trips = self.proxy.end()
        clock.lap("run")
        fired = self.proxy.fired
        if self._crashed_at is not None:
            connection.close()  # this process's connection died with the server
            ctx = {
                **ctx,
                "crash": {"pid": self._pid, "at": self._crashed_at, **self._crash_snapshots},
            }
        self.proxy.begin(None)
        self.proxy.drop_all()  # what a killed or hung pass left open
        violations: list[str] = []
        if code is None:
            violations.append(f"the pass hung for {RUN_TIMEOUT:.0f} s")
        elif fault is None and code != 0:
            violations.append(f"the clean pass exited {code}")
        run_pid = self._pid
        recovered = self._phase(scenario, "recover", ctx, log)
        self.proxy.drop_all()
        clock.lap("recover")
        if recovered != 0:
            violations.append(f"recovery exited {recovered}")
        killed_pid = run_pid if code == -signal.SIGKILL else None
        violations.extend(scenario.check(ctx, killed_pid=killed_pid))
        clock.lap("check")
        outcome = Outcome(scenario.name, fault, trip, fired, code, violations, str(log), clock.laps)
        return outcome, trips

    def record(self, scenario: Scenario) -> tuple[Outcome, list[RoundTrip]]:
        """The clean run: its round trips are what the faulted runs enumerate."""
        return self.attempt(scenario)

    def enumerate(
        self,
        scenario: Scenario,
        *,
        kinds: Iterable[str] = FAULT_KINDS,
        select_trips: Callable[[list[RoundTrip]], list[RoundTrip]] | None = None,
    ) -> list[Outcome]:
        """The clean run, then one run per (recorded round trip, fault kind)."""
        clean, trips = self.record(scenario)
        outcomes = [clean]
        chosen = select_trips(trips) if select_trips else trips
        for fault, trip in faults_for(chosen, kinds):
            outcomes.append(self.attempt(scenario, fault, trip)[0])
        return outcomes

    def cases(
        self, scenario: Scenario, picks: Iterable[tuple[str, Callable[[RoundTrip], bool], int]]
    ) -> list[Outcome]:
        """The clean run, then for each (kind, where, nth) that fault at the `nth` recorded
        round trip `where` picks: named cases, regression tests for one moment each. All
        outcomes, the clean run first."""
        clean, trips = self.record(scenario)
        outcomes = [clean]
        for kind, where, nth in picks:
            picked = [trip for trip in trips if where(trip)]
            if len(picked) <= nth:
                raise LookupError(f"{scenario.name}: no round trip {nth} of {len(picked)} picked")
            trip = picked[nth]
            fault = Fault(kind, trip.statement, trip.occurrence)
            outcomes.append(self.attempt(scenario, fault, trip)[0])
        return outcomes

    def case(
        self, scenario: Scenario, kind: str, where: Callable[[RoundTrip], bool], nth: int = 0
    ) -> list[Outcome]:
        """One named case: the clean run and one faulted run."""
        return self.cases(scenario, [(kind, where, nth)])

    def _phase(self, scenario: Scenario, phase: str, ctx: dict, log: Path) -> int | None:
        """Run one phase in a forked child; its exit code, or None if it hung (killed)."""
        request = {
            "scenario": f"{type(scenario).__module__}:{scenario_attr(scenario)}",
            "phase": phase,
            "ctx": ctx,
            "log": str(log),
        }
        with open(log, "a") as out:
            out.write(f"--- {phase}\n")
        self._pid_known.clear()
        self._zygote.stdin.write((json.dumps(request) + "\n").encode())
        self._zygote.stdin.flush()
        forked = self._read(FORK_TIMEOUT)
        if forked is None:
            raise AssertionError(
                f"the fork server gave no pid within {FORK_TIMEOUT:.0f} s; "
                f"see {self.workdir}/fork-server.log"
            )
        self._pid = forked["pid"]
        self._pid_known.set()
        answer = self._read(RUN_TIMEOUT)
        if answer is None:
            os.kill(self._pid, signal.SIGKILL)
            self._read(FORK_TIMEOUT)
            return None
        return answer["exit"]

    def _kill(self) -> None:
        """The proxy's `kill_after`: SIGKILL the pass's process before it sees the answer."""
        if self._pid_known.wait(10):
            os.kill(self._pid, signal.SIGKILL)

    def _crash(self) -> None:
        """The proxy's `crash_after`: stop the cluster at once (every server process
        killed, what was only in its memory lost) and start it again (crash recovery), before
        the pass sees the answer."""
        assert self.cluster is not None
        with self.cluster.connect() as conn:
            self._crash_snapshots["before"] = self._scenario.crash_snapshot(conn)
        self._crashed_at = time.time()
        crash_and_restart(self.cluster)
        with self.cluster.connect() as conn:
            self._crash_snapshots["after"] = self._scenario.crash_snapshot(conn)

    def _read(self, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        out = self._zygote.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            chunk = os.read(out, 4096)
            if not chunk:
                raise RuntimeError(f"the fork server died; see {self.workdir}/fork-server.log")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


class _Stopwatch:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._last, 2)
        self._last = now


def scenario_attr(scenario: Scenario) -> str:
    """The module attribute that holds `scenario` (how the child finds it)."""
    module = importlib.import_module(type(scenario).__module__)
    for name, value in vars(module).items():
        if value is scenario:
            return name
    raise LookupError(f"{scenario!r} is not a module-level instance")


def faults_for(trips: Iterable[RoundTrip], kinds: Iterable[str]) -> list[tuple[Fault, RoundTrip]]:
    """Each fault kind at each round trip it applies to: a lost answer only where the server
    was idle after it (committed or autocommit; inside a transaction, a lost connection is a
    rollback, which `error_before` of the next round trip covers). A crash applies after
    every round trip: inside a transaction it is that transaction's rollback and every other
    connection's loss at once."""
    kinds = list(kinds)
    planned = []
    for trip in trips:
        for kind in kinds:
            if kind == LOST_ANSWER and not trip.committed:
                continue
            planned.append((Fault(kind, trip.statement, trip.occurrence), trip))
    return planned


def reset_database() -> None:
    """Empty every table of the test database (a fresh one per run, in one statement)."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE {} RESTART IDENTITY CASCADE".format(
                ", ".join(connection.ops.quote_name(table) for table in tables)
            )
        )


__all__ = [
    "CRASH_AFTER",
    "ERROR_BEFORE",
    "FAULT_KINDS",
    "KILL_AFTER",
    "LOST_ANSWER",
    "FaultHarness",
    "Outcome",
    "Scenario",
    "assert_held",
    "faults_for",
    "report",
    "summarize",
    "table",
]
