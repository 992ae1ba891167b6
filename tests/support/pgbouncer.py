"""A PgBouncer in transaction pooling mode in front of the test's PostgreSQL (Debian's
`pgbouncer` package; .ci/run installs it).

Transaction pooling is what a multi-host deployment usually runs: a client's consecutive
transactions may go to different server connections, and a server connection serves many
clients in turn. Anything that relies on session state across transactions (a session
advisory lock, a `SET`, a prepared statement, a `WITH HOLD` cursor, LISTEN) breaks or leaks
there, which one server connection per pool (`pool_size=1`) makes visible at once.

Used by the tests and by the scale-out rehearsal (tests/support/scale_out.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

BINARY = Path("/usr/sbin/pgbouncer")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgBouncer:
    """`with PgBouncer(direct_url) as bouncer:` runs one on a free port in a temporary folder;
    `bouncer.url(direct_url)` is the same database reached through it."""

    def __init__(self, direct_url: str, *, pool_size: int = 1, max_clients: int = 400) -> None:
        if not BINARY.exists():
            pytest.fail(f"{BINARY} is missing: install Debian's pgbouncer (.ci/run does)")
        parts = urlsplit(direct_url)
        self.server_host = parts.hostname or "127.0.0.1"
        self.server_port = parts.port or 5432
        self.user = parts.username or "postgres"
        self.pool_size = pool_size
        self.max_clients = max_clients
        self.port = 0
        self._process: subprocess.Popen | None = None
        self._folder: Path | None = None

    def url(self, direct_url: str) -> str:
        """`direct_url` with its host and port replaced by this PgBouncer's."""
        parts = urlsplit(direct_url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has passed to `database` so far (its admin console's
        SHOW STATS): proof that the clients went through it."""
        admin = f"host=127.0.0.1 port={self.port} user={self.user} dbname=pgbouncer"
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute("SHOW STATS")
            names = [column.name for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return sum(int(row["total_xact_count"]) for row in rows if row["database"] == database)

    def __enter__(self) -> PgBouncer:
        self._folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.port = free_port()
        config = self._folder / "pgbouncer.ini"
        users = self._folder / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        config.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_clients}\n"
            # Transaction pooling runs no reset query between clients: what one client's
            # session state leaves on a server connection, the next client gets.
            "server_reset_query =\n"
            "logfile =\n"
            f"admin_users = {self.user}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        command = [str(BINARY), str(config)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            self._folder.chmod(0o755)
            for path in (config, users):
                path.chmod(0o644)
            command[1:1] = ["-u", "postgres"]
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=open(self._folder / "pgbouncer.log", "w"),  # noqa: SIM115 - the child owns it
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = (self._folder / "pgbouncer.log").read_text()
                    self.__exit__()
                    raise RuntimeError(f"PgBouncer did not start:\n{log}") from None
                time.sleep(0.05)

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


@contextmanager
def django_through_pgbouncer(*, pool_size: int = 1) -> Iterator[str]:
    """Django's default connection, and every connection copied from its settings or opened by
    another thread, through a PgBouncer in transaction pooling; yields the pooled URL. The
    settings dict is shared by every thread's wrapper of the alias, so one update moves all."""
    from django.db import connection

    from tests.support.processes import test_database_url

    direct = test_database_url()
    with PgBouncer(direct, pool_size=pool_size) as bouncer:
        saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
        connection.close()
        # Django's pool (project/db_pool.py) connects with the parameters it was created
        # with: closed, the next query opens one through PgBouncer (and, after, direct).
        connection.close_pool()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=bouncer.port)
        try:
            yield bouncer.url(direct)
        finally:
            connection.close()
            connection.close_pool()
            connection.settings_dict.update(saved)
