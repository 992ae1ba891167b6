"""The admin as production serves it: collectstatic, then gunicorn with DEBUG off."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import PROJECT_ROOT, manage_py, stop_process_group


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def gunicorn(env: dict[str, str], log: Path, *, timeout: float = 60) -> Iterator[str]:
    """collectstatic into env's WORKER_VAR_DIR, then `gunicorn project.wsgi` on a free port;
    yields its base URL once it answers, stops its process group on exit."""
    collected = manage_py("collectstatic", "--no-input", env=env)
    assert collected.returncode == 0, collected.stderr
    url = f"http://127.0.0.1:{free_port()}"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "project.wsgi", "--bind", url[7:], "--workers", "1"],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert server.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(f"{url}/admin/login/", timeout=5).close()
                break
            except OSError:  # refused, reset, or a first answer slower than 5 s (a loaded host)
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        yield url
    finally:
        stop_process_group(server)
