"""Issue 36.8: with the database down the admin showed a bare "Server Error (500)". A view
that cannot reach the database now answers 503 with a page that names the server it tried
(never its password) and what to check, logged once per outage.

The errors here are real: a connection attempt to a port nothing listens on, a statement
cancelled by its timeout.
"""

from __future__ import annotations

import logging
import socket

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.http import HttpResponse
from django.test import RequestFactory

from ops.database_down import DatabaseDownMiddleware, database_address

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on return: nothing listens there


@pytest.fixture
def refused() -> tuple[OperationalError, dict]:
    """The error Django raises when its server does not answer (a real connect attempt)."""
    config = {
        **connections["default"].settings_dict,
        "HOST": "127.0.0.1",
        "PORT": str(_closed_port()),
        "PASSWORD": "s3cret-pw",
    }
    unreachable = type(connections["default"])(config, alias="unreachable")
    with pytest.raises(OperationalError) as raised:
        unreachable.ensure_connection()
    return raised.value, config


def test_a_refused_connection_answers_503_naming_the_server_not_its_password(refused, caplog):
    exc, config = refused
    middleware = DatabaseDownMiddleware(lambda request: HttpResponse())
    request = RequestFactory().get("/admin/jobs/job/")

    with caplog.at_level(logging.INFO, logger="ops.database_down"):
        response = middleware.process_exception(request, exc)
        again = middleware.process_exception(RequestFactory().post("/admin/login/"), exc)

    assert (response.status_code, again.status_code) == (503, 503)
    assert response["Retry-After"] == "30"
    page = response.content.decode()
    where = database_address()  # the server this process is set to use (its settings)
    assert f"The database is not reachable: {where}." in page
    assert "Is run-worker running?" in page and "Is PostgreSQL running?" in page
    assert "<title>The database is not reachable | Proposal-assistant worker</title>" in page
    assert "Django" not in page and "s3cret-pw" not in page
    # One line for the outage (the second request is counted, not logged), no traceback.
    (record,) = caplog.records
    assert record.levelname == "WARNING" and record.exc_info is None
    assert record.getMessage().startswith(
        f"GET /admin/jobs/job/: the database at {where} is not reachable (OperationalError: "
    )
    assert record.action == "web_database_down"
    assert f"port {config['PORT']} failed" in record.getMessage()  # libpq's own words
    assert "s3cret-pw" not in record.getMessage()


def test_a_statement_error_is_not_taken_for_a_database_down(db):
    """A statement timeout is our error: a 500 with its traceback, not "start PostgreSQL"."""
    with pytest.raises(OperationalError) as raised, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = 10")
            cursor.execute("SELECT pg_sleep(1)")
    middleware = DatabaseDownMiddleware(lambda request: HttpResponse())
    assert middleware.process_exception(RequestFactory().get("/admin/"), raised.value) is None
    assert middleware.process_exception(RequestFactory().get("/admin/"), ValueError()) is None


def test_the_address_of_a_unix_socket_names_its_folder():
    embedded = {"HOST": "/srv/worker/var/pg", "PORT": "", "NAME": "worker", "PASSWORD": "x"}
    assert database_address(embedded) == (
        "the Unix socket in /srv/worker/var/pg (port 5432), database worker"
    )
    tcp = {"HOST": "db.internal", "PORT": "6432", "NAME": "worker", "PASSWORD": "x"}
    assert database_address(tcp) == "db.internal:6432, database worker"
    default = connections["default"].settings_dict
    assert database_address() == database_address(default)


def test_the_first_request_that_reaches_the_database_again_says_so(refused, caplog):
    def view(request):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return HttpResponse()

    middleware = DatabaseDownMiddleware(view)
    with caplog.at_level(logging.INFO, logger="ops.database_down"):
        middleware.process_exception(RequestFactory().get("/admin/"), refused[0])
        middleware(RequestFactory().get("/admin/"))
        middleware(RequestFactory().get("/admin/"))  # no failure since: nothing more to say
    first, recovered = caplog.records
    assert recovered.levelname == "INFO"
    assert recovered.getMessage().startswith(
        "web requests: the database answers again after 1 failed try in "
    )
