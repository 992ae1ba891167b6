"""manage.py's entry point: a configuration error stops start-up with one line, not a
traceback.

- A setting the parser refuses (project/settings.py, an app's conf at ready()) raises
  ImproperlyConfigured: printed as one line naming the variable, exit 1.
- Before a command that needs the database (DATABASE_COMMANDS) the system checks run with the
  database included (Django runs database checks only when asked, and runserver, qcluster or
  worker_status never ask): each error is one line, the fix included, exit 1.
- `-v 3`, `--traceback` or LOG_LEVEL=DEBUG: the traceback too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from pathlib import Path

# Commands that need the database (Django's and ours); `check --database default` runs the
# same checks through Django. Others (help, makemigrations, collectstatic...) run as before.
DATABASE_COMMANDS = frozenset(
    {
        "qcluster",
        "migrate",
        "runserver",
        "worker_status",
        "run_jobs",
        "reap_stale",
        "poll_inbound_email",
        "run_sweeps",
        "mint_messages",
        "setup_schedules",
        "demo",
        "createsuperuser",
        "changepassword",
        "showmigrations",
        "shell",
        "dbshell",
        "loaddata",
        "dumpdata",
        "flush",
    }
)
NO_SETUP_COMMANDS = frozenset({"help", "--help", "-h", "version", "--version"})
CHECKOUT = Path(__file__).resolve().parent.parent  # manage.py's folder


def wants_traceback(argv: list[str]) -> bool:
    args = argv[2:]
    for index, arg in enumerate(args):
        if arg in {"-v3", "--verbosity=3", "--traceback"}:
            return True
        if arg in {"-v", "--verbosity"} and args[index + 1 : index + 2] == ["3"]:
            return True
    return os.environ.get("LOG_LEVEL", "").strip().upper() == "DEBUG"


def _say(line: str) -> None:
    print(" ".join(line.split()), file=sys.stderr)  # one line, whatever the message held


def main(argv: list[str]) -> int:
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    command = argv[1] if len(argv) > 1 else "help"
    if command in NO_SETUP_COMMANDS:
        execute_from_command_line(argv)
        return 0
    verbose = wants_traceback(argv)
    try:
        import django

        django.setup()
    except ImproperlyConfigured as exc:
        if verbose:
            raise
        about_database = str(exc).startswith(("DATABASE_URL", "Environment variable DATABASE_URL"))
        if command in DATABASE_COMMANDS and not about_database:
            problem = _database_problem()  # the database first: it is what one sets up first
            if problem:
                _say(problem)
        _say(f"configuration error: {exc}")
        return 1
    if command == "createsuperuser" and not _can_prompt(argv):
        _say(
            "createsuperuser: no terminal to ask for the password; without one run: "
            + manage_py_line(
                "createsuperuser --no-input --username admin --email admin@localhost",
                env="DJANGO_SUPERUSER_PASSWORD='choose-one'",
            )
        )
        return 1
    if command in DATABASE_COMMANDS and "--skip-checks" not in argv:
        if not _preflight(verbose):
            return 1
    execute_from_command_line(argv)
    return 0


def manage_py_line(args: str, *, env: str = "") -> str:
    """`manage.py <args>` as a line that runs as pasted in any shell (issue 36.8: `python
    manage.py …` did not: no `python`, or one without Django): this interpreter, the venv's
    python, relative to the checkout when inside it, and `cd <checkout> && ` first when the
    command ran in another folder. `env`: assignments for the command alone."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(CHECKOUT)
    prefix = "" if Path.cwd().resolve() == CHECKOUT else f"cd {shlex.quote(str(CHECKOUT))} && "
    assignments = f"{env} " if env else ""
    return f"{prefix}{assignments}{shlex.quote(str(python))} manage.py {args}"


def _can_prompt(argv: list[str]) -> bool:
    """Django's createsuperuser without a terminal skips the user and exits 0 (issue 31.7):
    the printed next step seemed to work. With --no-input it needs none."""
    if {"--no-input", "--noinput"} & set(argv):
        return True
    return sys.stdin.isatty()


def _database_problem() -> str | None:
    """When the settings stop on another variable (SECRET_KEY), whether the database would
    have stopped them too: that line comes first. Read from the environment alone (the
    settings did not load); bounded like the check (ops/checks.py)."""
    import psycopg
    from django.core.exceptions import ImproperlyConfigured

    from ops.checks import CONNECT_TIMEOUT, database_error
    from project import embedded_pg
    from project.env import env_db

    try:
        config = env_db("DATABASE_URL", embedded_pg.database_url())
    except ImproperlyConfigured as exc:
        return f"configuration error: {exc}"
    try:
        psycopg.connect(
            host=config.get("HOST") or None,
            port=config.get("PORT") or None,
            user=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            dbname=config.get("NAME") or None,
            connect_timeout=CONNECT_TIMEOUT,
        ).close()
    except psycopg.Error as exc:
        error = database_error(config, exc, embedded=not os.environ.get("DATABASE_URL"))
        return f"configuration error ({error.id}): {error.msg}; {error.hint}"
    return None


def _preflight(verbose: bool) -> bool:
    """The system checks, the database's included; False (and one line each) on an error."""
    from django.conf import settings
    from django.core import checks
    from django.db import DEFAULT_DB_ALIAS

    if verbose or str(getattr(settings, "LOG_LEVEL", "")).upper() == "DEBUG":
        logging.getLogger("ops.checks").setLevel(logging.DEBUG)
    messages = checks.run_checks(databases=[DEFAULT_DB_ALIAS])
    errors = [m for m in messages if m.is_serious() and not m.is_silenced()]
    for error in errors:
        fix = f"; {error.hint}" if error.hint else ""
        _say(f"configuration error ({error.id}): {error.msg}{fix}")
    return not errors
