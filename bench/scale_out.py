"""Scale-out rehearsal: three qclusters through PgBouncer, two with skewed clocks.

Usage (PostgreSQL; the database named in DATABASE_URL is DROPPED and re-created, so its
name must contain "scale"; Debian's pgbouncer and faketime installed):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/wb_scale .venv/bin/python bench/scale_out.py \
        [--jobs 5000] [--mails 500] [--workers 2] [--pool-size 10] [--workdir var/scale_out]

The scenario (shared with tests/system/test_scale_out.py, which runs it with the same
numbers in CI) is in tests/support/scale_out.py: a PgBouncer in transaction pooling on a
free port, three `manage.py qcluster` through it (clock offsets 0, +5 min, -5 min under
libfaketime; LISTEN direct through LISTEN_DATABASE_URL), 5,000 jobs by plain SQL, 500 PIs
mailed by the new-proposal sweep and their 500 replies dropped into the mail folder. It
prints the wall time of the work and the checks (every job completed and started once,
every notice mailed once, every mail handled once, no canonical id minted twice), and exits
non-zero if one failed. First it runs the same work with the clusters connected directly
and no clock skew (the baseline; `--no-baseline` skips it) and prints the ratio of the two
wall times. The clusters' logs are left in the work directory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from tests.support.processes import test_database_url  # noqa: E402
from tests.support.scale_out import ScaleOut, ScaleOutSettings  # noqa: E402


def recreate_database() -> None:
    """A clean database per run: every row the checks count was made by this run."""
    name = connection.settings_dict["NAME"]
    if "scale" not in name:
        sys.exit(f"bench/scale_out.py drops its database; {name!r} must contain 'scale'")
    connections.close_all()
    maintenance = psycopg.conninfo.make_conninfo(
        test_database_url().replace(f"/{name}", "/postgres")
    )
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--mails", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2, help="django-q2 workers per cluster")
    parser.add_argument("--pool-size", type=int, default=10, help="PgBouncer server connections")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline run (the same work, the clusters connected directly, no skew)",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    # SIGTERM unwinds through the run's clean-up, so the clusters and PgBouncer stop with it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scale-out-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"scale-out rehearsal: logs in {workdir}", flush=True)
    common = {
        "jobs": args.jobs,
        "mails": args.mails,
        "workers": args.workers,
        "pool_size": args.pool_size,
        "timeout": args.timeout,
    }
    runs = [("rehearsal", ScaleOutSettings(**common))]
    if not args.no_baseline:
        # The same machine and work, no pooler and no skew: what the figures compare with.
        runs.insert(0, ("baseline", ScaleOutSettings(**common, pooled=False, skews=(0, 0, 0))))
    work = "work (jobs inserted → all done)"
    reports = {}
    for name, config in runs:
        recreate_database()
        folder = workdir / name
        folder.mkdir(exist_ok=True)
        reports[name] = report = ScaleOut(config, folder).run()
        print(f"\n[{name}]\n{report.table()}", flush=True)
    if "baseline" in reports:
        ratio = reports["rehearsal"].seconds[work] / reports["baseline"].seconds[work]
        print(f"\nrehearsal / baseline wall time of the work: {ratio:.2f}x")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    failed = any(report.failed or not report.done for report in reports.values())
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
