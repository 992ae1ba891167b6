"""Many hosts, one clock: two worker hosts whose clocks are 5 minutes ahead and behind.

Every lease, heartbeat and expiry is stamped and compared on the database's clock, so a
skew far longer than the lease changes nothing: a job that outlives several leases, kept
alive by its heartbeats, runs once and is never reaped by the other host's reaper, and the
two hosts' minters never mint the same id. The lease is a few seconds here (not minutes) so
the test is short; the skew is a hundred times longer than it.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from canonical_ids.models import Message
from jobs import enqueue
from jobs.models import Job
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until
from tests.support.skew import skewed_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SKEW_SECONDS = 300  # each way: the hosts are 10 minutes apart
LEASE_SECONDS = 3
JOB_SECONDS = 12  # four leases long, kept alive by heartbeats

REAP_LOOP = (
    "import time\n"
    "from jobs.reaper import jobs_reap_stale\n"
    "while True:\n"
    "    for job in jobs_reap_stale():\n"
    "        print('reaped', job.describe(), flush=True)\n"
    "    time.sleep(0.3)\n"
)


def _status(pk: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=pk)


def test_hosts_ten_minutes_apart_run_a_long_job_once_reap_nothing_and_mint_unique_ids(
    subprocess_env, tmp_path
):
    env = {
        **subprocess_env,
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers",
        "JOBS_LEASE_SECONDS": str(LEASE_SECONDS),
        "JOBS_HEARTBEAT_SECONDS": "0.5",
        "JOBS_POLL_SECONDS": "0.2",
        "CANONICAL_IDS_LEASE_TTL": str(LEASE_SECONDS),
        "CANONICAL_IDS_RENEW_INTERVAL": "0.5",
    }
    ahead, behind = skewed_env(env, SKEW_SECONDS), skewed_env(env, -SKEW_SECONDS)
    log = tmp_path / "runs.log"
    started = []

    def start(*args: str, env: dict[str, str]):
        process = spawn_manage_py(*args, env=env, start_new_session=True)
        started.append(process)
        return process

    try:
        # The host behind starts alone: the job is due by the database's clock, though five
        # minutes in the future by this host's.
        start("run_jobs", env=behind)
        first = enqueue("tests.log", {"n": 1, "log": str(log), "sleep": JOB_SECONDS})
        wait_until(lambda: _status(first.pk) == Job.Status.PROCESSING, "the host behind", 30)
        # The host ahead, for which that lease ran out five minutes ago, joins with a worker
        # and a reaper, and the host behind reaps too; a second long job goes to either.
        start("run_jobs", env=ahead)
        reapers = [start("shell", "-c", REAP_LOOP, env=host) for host in (ahead, behind)]
        second = enqueue("tests.log", {"n": 2, "log": str(log), "sleep": JOB_SECONDS / 2})
        minters = [
            start("mint_messages", "--run-id", "skew", "--count", "300", env=host)
            for host in (ahead, behind)
        ]
        for minter in minters:
            out, err = minter.communicate(timeout=120)
            assert minter.returncode == 0, err
            assert json.loads(out.strip().splitlines()[-1])["count"] == 300
        wait_until(
            lambda: {_status(first.pk), _status(second.pk)} == {Job.Status.COMPLETED},
            "both jobs to complete",
            timeout=JOB_SECONDS * 3 + 30,
        )
    except AssertionError:
        for process in started:
            stop_process_group(process, timeout=10)
        print(*(p.stderr.read()[-3000:] for p in started if not p.stderr.closed), sep="\n--\n")
        raise
    finally:
        for process in started:
            stop_process_group(process, timeout=10)

    reaped = [line for p in reapers for line in p.stdout.read().splitlines() if "reaped" in line]
    assert reaped == [], "a reaper took a live job"
    runs = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert runs == {"1": 1, "2": 1}, "a job ran more than once"
    assert set(
        Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("attempts", "last_error")
    ) == {(1, "")}
    ids = list(Message.objects.filter(run_id="skew").values_list("ts", flat=True))
    assert len(ids) == 600 and len(set(ids)) == 600
