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

import logging
import os
import sys

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
        _say(f"configuration error: {exc}")
        return 1
    if command in DATABASE_COMMANDS and "--skip-checks" not in argv:
        if not _preflight(verbose):
            return 1
    execute_from_command_line(argv)
    return 0


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
