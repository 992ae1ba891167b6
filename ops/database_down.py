"""A page that says the database is down, instead of Django's bare "Server Error (500)".

With PostgreSQL stopped (run-worker not started, the server down, a wrong DATABASE_URL
host or port), every admin page but the login form failed with "Server Error (500)" and a
traceback per request in the log (issue 36.8): nothing told a newcomer what was wrong. A
view (or its template) that raises a lost or refused connection now answers 503 with a
page naming the server it tried (host and port, or the embedded server's socket folder;
never the user or password) and what to check, and the log says so once per outage, then
counts (project/quiet_log.py), rather than a traceback per request.

Only a connection that could not be made or was lost counts (`connection_lost`): a
statement timeout or a bad query is still an error of ours, a 500 with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from project.admin_site import SITE_NAME
from project.quiet_log import QuietLog, connection_lost

logger = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = 30  # the 503's Retry-After: a restarted server is up within seconds


def database_address(config: dict | None = None) -> str:
    """Where the web process looks for its database, in words, without credentials:
    "127.0.0.1:5432, database worker", or the embedded server's socket folder."""
    # The connection's own settings (what it dialled), not a second read of DATABASES.
    config = config if config is not None else connections[DEFAULT_DB_ALIAS].settings_dict
    host = config.get("HOST") or "localhost"
    port = config.get("PORT") or 5432
    name = config.get("NAME") or "?"
    if host.startswith("/"):  # a Unix socket's folder: the embedded server, or a local one
        return f"the Unix socket in {host} (port {port}), database {name}"
    return f"{host}:{port}, database {name}"


class DatabaseDownMiddleware:
    """Turns a view's lost or refused database connection into a 503 page that says so."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        # One per process (Django builds the chain once): an outage logs once, then counts.
        self.quiet = QuietLog(logger, "web requests")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # A request that held a connection and did not fail: the database answers again.
        if self.quiet.failures and connections[DEFAULT_DB_ALIAS].connection is not None:
            if response.status_code != 503:
                self.quiet.recovered("the database answers again")
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        if not connection_lost(exception):
            return None  # a statement's own error: a 500, logged with its traceback
        where = database_address()
        self.quiet.failed(
            exception,
            "%s %s: the database at %s is not reachable",
            request.method,
            request.path,
            where,
            then="; answered 503",
            extra={"action": "web_database_down"},
        )
        page = render_to_string(
            "ops/database_down.html",
            {
                "site_header": SITE_NAME,
                "site_title": SITE_NAME,
                "title": "The database is not reachable",
                "where": where,
            },
        )
        response = HttpResponse(page, status=503)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        # Logged above, once per outage: Django would add an ERROR line per request.
        response._has_been_logged = True  # noqa: SLF001 - django.utils.log.log_response's flag
        return response
