"""The operator console on a big database: p95 of each admin page over HTTP (Django's test
client, DEBUG off), with 1,000,000 jobs and 100,000 mails. Target: every page under 300 ms p95.

Usage (PostgreSQL; the database is created/migrated if needed, its jobs and mail replaced):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker_bench .venv/bin/python bench/console.py \
        [--jobs 1000000] [--mails 100000] [--rounds 20] [--keep]

Rows are made by `generate_series` in a few statements (about a minute for the defaults):
jobs over 14 days (2 % failed with a handful of error texts, 1 % queued, a few stuck in
processing past their lease, those two with an attempt row), mail over 7 days; row triggers
are off while filling (session_replication_role); the job counts and the failed rows' error
group keys are written once after, as the triggers would have.
`--keep` reuses the rows of an earlier run. The baseline printed first is `worker_status()`
in this process: the pages are compared with what the command costs on the same data.

Then, with the triggers on, `--pending-seconds` (10) of a live system at 1,000 jobs/s: one
INSERT statement per job and a claim and a completion statement per 20 jobs, as the runner
sends them. The triggers append their deltas (issue 32: no hot rows) and nothing rolls them
up: every reader (the health page, `worker_status`, `/metrics`) sums them on top of the
rolled-up rows. 10 s is twice what the qcluster's rollup thread (OPS_ROLLUP_SECONDS, 5 s)
leaves; 60 is the most the minute schedule alone leaves.
`/metrics` is read with its bearer token (METRICS_TOKEN is set for this process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.support import setup_django_like_production  # noqa: E402

METRICS_TOKEN = os.environ.setdefault("METRICS_TOKEN", "bench-metrics-token-" + "m" * 24)
setup_django_like_production()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

from bench.support import ensure_database  # noqa: E402
from ops.status import worker_status  # noqa: E402

TARGET_MS = 300


def fill(jobs: int, mails: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE jobs_job, jobs_jobattempt, jobs_jobcount, inbound_email_reply, "
            "inbound_email_inboundemail, ops_metricseries, ops_jobperiod, jobs_jobcountdelta, "
            "ops_metricdelta, ops_jobperioddelta CASCADE"
        )
        # Row triggers off while filling (their per-row work is what a live system spreads
        # over weeks); the counts they keep are written once below.
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            """
            INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts,
                                  run_after, created_at, started_at, completed_at, failed_at,
                                  locked_by, lease_expires_at, last_error,
                                  unique_key, tags, meta)
            SELECT 'bench.k' || (i %% 7), '{}'::jsonb, st, 0, 1, 5, t, t, t,
                   CASE WHEN st = 'completed' THEN t END,
                   CASE WHEN st = 'failed' THEN t END,
                   CASE WHEN st = 'processing' THEN 'host-' || (i %% 3) || ':' || i || ':ab'
                        ELSE '' END,
                   CASE WHEN st = 'processing' THEN now() - interval '5 minutes' END,
                   CASE WHEN st = 'failed' THEN
                       (ARRAY['ValueError: user ' || i || ' not found',
                              'TimeoutError: upstream took ' || (i %% 90) || ' s',
                              'KeyError: ''k' || (i %% 5) || ''''])[1 + i %% 3]
                       || E'\\n\\nTraceback (most recent call last):\\n  ...'
                   ELSE '' END,
                   -- issue 38: a key on every queued or processing job, tags on one in 20
                   -- (one in 1,000 also "rare"), meta on one in 10 (20 jobs per proposal)
                   CASE WHEN st IN ('queued', 'processing') THEN 'draft:' || i END,
                   CASE WHEN i %% 1000 = 0 THEN ARRAY['slack', 'rare']
                        WHEN i %% 20 = 0 THEN ARRAY['slack'] END,
                   CASE WHEN i %% 10 = 0 THEN jsonb_build_object('proposal', i %% 5000) END
            FROM (SELECT i, now() - make_interval(secs => i * (14 * 86400.0 / %s)) AS t,
                         CASE WHEN i %% 50 = 0 THEN 'failed' WHEN i %% 97 = 0 THEN 'queued'
                              WHEN i %% 100003 = 0 THEN 'processing' ELSE 'completed' END AS st
                  FROM generate_series(1, %s) AS i) AS s
            """,
            [jobs, jobs],
        )
        cursor.execute(
            """
            INSERT INTO jobs_jobattempt (job_id, number, worker, started_at, finished_at,
                                         outcome, error)
            SELECT id, 1, 'host-1:1:ab', started_at, coalesce(completed_at, failed_at),
                   CASE status WHEN 'completed' THEN 'completed' WHEN 'failed' THEN 'failed'
                               ELSE 'running' END, left(last_error, 200)
            FROM jobs_job WHERE status IN ('failed', 'processing')
            """
        )
        cursor.execute(
            """
            INSERT INTO inbound_email_inboundemail
                (store_key, etag, size, sha256, dedup_key, message_id, from_address,
                 to_addresses, subject, headers_text, body_text, status, reason, detail,
                 attempts, last_error, quarantine_key, intake_deleted, created_at, updated_at)
            SELECT 'bench/' || i, '', 0, '', '', '', 'pi' || (i %% 300) || '@uni.example',
                   'replies@reply.example', 'Re: proposal ' || (i %% 1000), '', '',
                   CASE WHEN i %% 40 = 0 THEN 'quarantined' WHEN i %% 9 = 0 THEN 'rejected'
                        ELSE 'processed' END,
                   CASE WHEN i %% 40 = 0 THEN 'permanent_error' ELSE '' END, '',
                   1, '', '', true, t, t
            FROM (SELECT i, now() - make_interval(secs => i * (7 * 86400.0 / %s)) AS t
                  FROM generate_series(1, %s) AS i) AS s
            """,
            [mails, mails],
        )
        # What the error-group trigger (jobs migration 0008) writes when a row fails.
        cursor.execute(
            "UPDATE jobs_job SET error_group = jobs_error_group(kind, last_error) "
            "WHERE status = 'failed'"
        )
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute(
            "INSERT INTO jobs_jobcount (kind, status, shard, n) "
            "SELECT kind, status, 0, count(*) FROM jobs_job GROUP BY kind, status"
        )
        # The health page's per-kind periods at their most: every kind, 30-minute period and
        # shard of the 8 days kept (ops.job_periods.JOB_PERIODS_KEPT).
        cursor.execute(
            "INSERT INTO ops_jobperiod (start, kind, shard, completed, failed, retried, "
            "durations, waits) SELECT p, 'bench.k' || k, s, 10, 1, 1, "
            "array_fill(1::bigint, ARRAY[13]), array_fill(1::bigint, ARRAY[12]) "
            "FROM generate_series(date_trunc('hour', now()) - interval '8 days', "
            "date_trunc('hour', now()), interval '30 minutes') AS p, "
            "generate_series(0, 6) AS k, generate_series(0, 7) AS s"
        )
        # A steady state: autovacuum has set the visibility map, so index-only scans work.
        for table in ("jobs_job", "jobs_jobattempt", "inbound_email_inboundemail", "ops_jobperiod"):
            cursor.execute(f"VACUUM ANALYZE {table}")


# One job's life as the triggers see it, `per_second` jobs a second for `seconds`: a single-row
# INSERT per job (what a producer sends), then per 20 jobs one claim and one completion
# statement (what the runner's batched step sends). Each statement fires the statement
# triggers, which append the count, metric and period deltas a live system leaves between
# two rollups.
PENDING_ACTIVITY = """
DO $$
DECLARE
    v_ids bigint[] := '{}';
    v_id bigint;
BEGIN
    FOR i IN 1 .. %(jobs)s LOOP
        INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts,
                              run_after, created_at, locked_by, last_error)
        VALUES ('bench.k' || (i %% 7), '{}', 'queued', 0, 0, 3, now(), now(), '', '')
        RETURNING id INTO v_id;
        v_ids := v_ids || v_id;
        IF cardinality(v_ids) = 20 THEN
            UPDATE jobs_job SET status = 'processing', attempts = 1, locked_by = 'bench:1:ab',
                heartbeat_at = now(), lease_expires_at = now() + interval '5 minutes'
            WHERE id = ANY(v_ids);
            UPDATE jobs_job SET status = 'completed', started_at = now(), completed_at = now(),
                locked_by = '', lease_expires_at = NULL
            WHERE id = ANY(v_ids);
            v_ids := '{}';
        END IF;
    END LOOP;
END $$
"""


def pending_deltas(seconds: float, per_second: int = 1000) -> dict[str, int]:
    """Leave `seconds` of live activity's deltas not rolled up; their count per table."""
    with connection.cursor() as cursor:
        cursor.execute(PENDING_ACTIVITY, {"jobs": round(seconds * per_second)})
        counts = {}
        for table in ("jobs_jobcountdelta", "ops_metricdelta", "ops_jobperioddelta"):
            cursor.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
    return counts


def pages() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM jobs_job WHERE status = 'failed'")
        failed_job = cursor.fetchone()[0]
        cursor.execute("SELECT max(id) FROM inbound_email_inboundemail WHERE status = 'processed'")
        mail = cursor.fetchone()[0]
    jobs = reverse("admin:jobs_job_changelist")
    mails = reverse("admin:inbound_email_inboundemail_changelist")
    return {
        "health page": "/admin/worker-health/",
        "health page: 1 h": "/admin/worker-health/?range=1h",
        "health page: 7 d": "/admin/worker-health/?range=7d",
        "jobs list": jobs,
        "jobs list: failed": jobs + "?status__exact=failed",
        "jobs list: stuck": jobs + "?health=stuck",
        "jobs list: one kind": jobs + "?kind=bench.k3",
        # issue 38: tags, exact meta, unique keys
        "jobs list: tag (5 %)": jobs + "?tag=slack",
        "jobs list: tag (0.1 %)": jobs + "?tag=rare",
        "jobs list: proposal=812": jobs + "?q=proposal%3D812",
        "jobs list: key=draft:97": jobs + "?q=key%3Ddraft%3A97",
        "jobs list: with a key": jobs + "?has_key=yes",
        "a job (attempts)": reverse("admin:jobs_job_change", args=[failed_job]),
        "failed jobs by error": reverse("admin:jobs_job_error_groups"),
        "mail list": mails,
        "mail list: quarantined": mails + "?status__exact=quarantined",
        "a mail": reverse("admin:inbound_email_inboundemail_change", args=[mail]),
        "processes list": reverse("admin:processes_workerprocess_changelist"),
        "/metrics": "/metrics",
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--mails", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="reuse the rows already there")
    parser.add_argument(
        "--pending-seconds",
        type=float,
        default=10.0,
        help="seconds of activity at 1,000 jobs/s whose deltas are left not rolled up",
    )
    args = parser.parse_args()
    ensure_database()
    call_command("migrate", verbosity=0)
    pending: dict[str, int] = {}
    if not args.keep:
        started = time.perf_counter()
        fill(args.jobs, args.mails)
        pending = pending_deltas(args.pending_seconds)
        print(f"filled in {time.perf_counter() - started:.0f} s")
    user, _ = get_user_model().objects.get_or_create(
        username="bench-operator", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    client.force_login(user)
    urls = pages()
    times: dict[str, list[float]] = {name: [] for name in urls}
    baseline: list[float] = []
    for name, url in urls.items():  # warm-up (and every page must answer 200)
        status = client.get(url).status_code
        assert status == 200, (name, url, status)
    for _ in range(args.rounds):
        started = time.perf_counter()
        worker_status()
        baseline.append((time.perf_counter() - started) * 1000)
        for name, url in urls.items():
            started = time.perf_counter()
            client.get(url)
            times[name].append((time.perf_counter() - started) * 1000)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM jobs_job), "
            "(SELECT count(*) FROM inbound_email_inboundemail)"
        )
        jobs, mails = cursor.fetchone()
    print(f"{jobs:,} jobs, {mails:,} mails, {args.rounds} rounds, DEBUG=False")
    if pending:
        print(
            f"deltas not rolled up ({args.pending_seconds:g} s at 1,000 jobs/s): "
            + ", ".join(f"{table} {n:,}" for table, n in pending.items())
        )
    print(f"{'':28}{'median ms':>10}{'p95 ms':>9}  target {TARGET_MS} ms p95")
    print(f"{'worker_status() baseline':28}{statistics.median(baseline):10.1f}{p95(baseline):9.1f}")
    worst = 0.0
    for name, runs in times.items():
        high = p95(runs)
        worst = max(worst, high)
        flag = "" if high < TARGET_MS else "  OVER"
        print(f"{name:28}{statistics.median(runs):10.1f}{high:9.1f}{flag}")
    print(f"slowest page p95: {worst:.1f} ms ({'within' if worst < TARGET_MS else 'OVER'} target)")


if __name__ == "__main__":
    main()
