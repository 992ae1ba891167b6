"""The database check: can the worker reach DATABASE_URL (or the embedded server)?

A Django database check (tag `database`): Django runs it only when told which databases to
check — `manage.py check --database default`, `migrate` — and manage.py (project/cli.py) asks
for it before every command that needs the database (qcluster, runserver, worker_status...),
so a wrong URL or a stopped server is one line naming DATABASE_URL and the fix instead of a
78-line traceback. The connection attempt is bounded (CONNECT_TIMEOUT) and the password is
never printed. The exception itself is logged at DEBUG (LOG_LEVEL=DEBUG or `-v 3`)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from django.core.checks import Error, Tags, register
from django.db import DEFAULT_DB_ALIAS, connections

from ops.conf import get_config

CONNECT_TIMEOUT = 5  # seconds the check waits for the server

logger = logging.getLogger(__name__)


@register(Tags.database)
def check_database_reachable(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Error]:
    if not databases or DEFAULT_DB_ALIAS not in databases:
        return []
    import psycopg

    connection = connections[DEFAULT_DB_ALIAS]
    params = connection.get_connection_params()
    params["connect_timeout"] = min(int(params.get("connect_timeout") or 10), CONNECT_TIMEOUT)
    try:
        with psycopg.connect(**params) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        logger.debug("the database check failed", exc_info=True, extra={"action": "db_check"})
        return [database_error(connection.settings_dict, exc, embedded=get_config().db_is_embedded)]
    return []


def _start_command(pgdata: str) -> str:
    """A command that starts the embedded server from any folder and any shell: the
    checkout's folder, its var/ when not the default, and python3 (embedded_pg re-runs
    itself with the checkout's .venv python when python3 lacks the packages)."""
    from project import embedded_pg

    base = embedded_pg.CHECKOUT
    var_dir = Path(pgdata).parent
    prefix = f"cd {shlex.quote(str(base))} && "
    if var_dir.resolve() != (base / "var").resolve():
        prefix += f"WORKER_VAR_DIR={shlex.quote(str(var_dir))} "
    return f"{prefix}python3 -m project.embedded_pg start"


def database_error(params: dict[str, Any], exc: Exception, *, embedded: bool) -> Error:
    """The one line for a database that does not answer (also used by manage.py before the
    settings exist, when another setting is wrong too: the database is reported first)."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = reason.removeprefix("connection failed: ").removeprefix("connection is bad: ")
    host = params.get("HOST") or "localhost"
    where = (
        f"{host}/{params.get('NAME')}"
        if host.startswith("/")
        else (f"{host}:{params.get('PORT') or 5432}/{params.get('NAME')}")
    )
    if embedded:
        return Error(
            f"DATABASE_URL is unset and the embedded PostgreSQL in {host} is not running",
            hint=f"start it with scripts/run-worker, or paste: {_start_command(host)}; "
            "or set DATABASE_URL to a PostgreSQL server",
            id="ops.E001",
        )
    return Error(
        f"DATABASE_URL: cannot connect to {where} ({reason})",
        hint="check the server is up and DATABASE_URL is right "
        "(postgres://user:password@host:5432/dbname)",
        id="ops.E002",
    )
