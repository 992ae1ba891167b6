"""The fault harness's fork server: `python -m tests.support.fault_child MODULE...`.

Starting Django costs a second or more; the harness runs a scenario hundreds of times. So
this process sets Django up once (no connection opened), imports the scenario modules, and
forks a fresh child per run, as django-q2 forks its workers: each child is a new OS process
(its own connections, its own writer slot, its own pid to kill) that runs one phase of one
scenario and `os._exit`s.

Protocol, one JSON object per line: the harness writes `{"scenario": "module:NAME",
"phase": "run" | "recover", "ctx": {...}, "log": PATH}`; this answers `{"pid": N}` when the
child exists, then `{"exit": CODE}` (negative: the signal that ended it) when it is gone.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback


def main(modules: list[str]) -> None:
    import django

    django.setup()
    from django.db import connections

    for name in modules:
        importlib.import_module(name)
    connections.close_all()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        protocol.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        protocol.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request: dict) -> None:
    """Run one phase of one scenario; exit 0 if it returned, 1 if it raised (traceback in
    the run's log). Never returns."""
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from tests.support.fault_harness import load_scenario

        scenario = load_scenario(request["scenario"])
        scenario.in_child(request["phase"], request["ctx"])
        code = 0
    except BaseException:  # noqa: BLE001 - the child's only catch: report it in the log, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
