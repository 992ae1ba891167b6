"""A quiet outage (issue 31, point 2; invariant I24): a qcluster's log while its PostgreSQL
is down.

Usage:

    .venv/bin/python bench/outage.py [--minutes 5] [--workers 4] [--workdir /tmp/outage]

It starts a throwaway embedded PostgreSQL (project/embedded_pg/, in the work directory),
migrates it, runs `manage.py qcluster` with the given number of workers and LOG_LEVEL=INFO,
lets it settle, stops the server for the given minutes (a fast shutdown: sessions are
ended), starts it again and waits a minute. Then it prints, for the outage and for the
time after it, the log's lines per minute, the records per loop (logger and process), the
tracebacks, the largest count of one loop's lines in any 30 s window and the recovery
lines. The database is removed at the end; the log is kept in the work directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from project import embedded_pg  # noqa: E402
from tests.support.outage_log import OutageLog  # noqa: E402


def _env(url: str, workdir: Path, workers: int) -> dict[str, str]:
    from project.secret_key import generate

    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        SECRET_KEY=env.get("SECRET_KEY") or generate(),
        DJANGO_SETTINGS_MODULE="project.settings",
        Q_WORKERS=str(workers),
        LOG_LEVEL="INFO",
        DEBUG="false",
        CANONICAL_IDS_ROLE="worker",
        INBOUND_EMAIL_STORE=str(workdir / "mail"),
        WORKER_VAR_DIR=str(workdir / "var"),
    )
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the database is down")
    parser.add_argument("--workers", type=int, default=4, help="Q_WORKERS of the qcluster")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before the outage")
    parser.add_argument("--after", type=float, default=60.0, help="seconds after it ends")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    pgdata = workdir / "var" / "pg"
    url = embedded_pg.start(pgdata=pgdata)
    env = _env(url, workdir, args.workers)
    log_path = workdir / "qcluster.log"
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
    )
    with log_path.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        time.sleep(args.settle)
        down_at = log_path.stat().st_size
        started = time.monotonic()
        embedded_pg.stop(pgdata=pgdata)
        time.sleep(args.minutes * 60)
        up_at = log_path.stat().st_size
        embedded_pg.start(pgdata=pgdata)
        back_at = time.monotonic() - started
        time.sleep(args.after)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGINT)
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait(timeout=10)
        embedded_pg.stop(pgdata=pgdata)
        embedded_pg.forget(pgdata)
    raw = log_path.read_bytes()
    down = OutageLog(raw[down_at:up_at].decode(errors="replace"))
    after = OutageLog(raw[up_at:].decode(errors="replace"))
    print(f"outage: {args.minutes:g} min down (back after {back_at:.0f} s), then {args.after:g} s")
    print(f"qcluster with {args.workers} workers; log: {log_path}")
    print(f"--- while the database was down ({args.minutes:g} min)")
    print(down.table(minutes=args.minutes))
    print(f"--- after it was back ({args.after:g} s: the recovery lines, then normal work)")
    print(after.table(minutes=args.after / 60))
    shutil.rmtree(workdir / "var", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
