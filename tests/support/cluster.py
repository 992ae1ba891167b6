"""Real qclusters against the test database, with S3/SES in moto's server mode and the local
Slack server: the pieces the system test, the chaos test and bench/soak.py share."""

from __future__ import annotations

import logging
import subprocess
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer
from moto.ses.models import ses_backends

from tests.support.processes import child_env, spawn_manage_py, stop_process_group

BUCKET = "system-test-inbound"
INTAKE = "inbound/"
REGION = "us-east-1"


def descendants(pid: int) -> set[int]:
    """pid and every process below it, read from /proc (the qcluster forks its workers)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children[ppid].append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(children.get(current, []))
    return found


class AwsServer:
    """moto in server mode (S3 intake bucket, SES with the sender verified) on a free port.

    It runs in this process, so `accepted_message_ids()` reads what SES really accepted.
    """

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.creds: dict[str, str] = {}
        self.s3: Any = None
        self.ses: Any = None

    def __enter__(self) -> AwsServer:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        self._server.start()
        host, port = self._server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # moto's backends are global to this process: start from nothing, not from what an
        # earlier server in the same test session (the chaos test, say) left behind.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
        self.creds = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint,
        }
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, **keys)
        self.s3.create_bucket(Bucket=BUCKET)
        self.ses = boto3.client("ses", endpoint_url=endpoint, region_name=REGION, **keys)
        self.ses.verify_domain_identity(Domain="localhost")
        self.ses.verify_domain_identity(Domain="reply.localhost")  # the envelope senders
        self.ses.verify_email_identity(EmailAddress="assistant@localhost")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop()

    def intake_count(self) -> int:
        return self.s3.list_objects_v2(Bucket=BUCKET, Prefix=INTAKE).get("KeyCount", 0)

    def put_mail(self, name: str, raw: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=f"{INTAKE}{name}.eml", Body=raw)

    @staticmethod
    def accepted_message_ids() -> list[str]:
        return [m.id for m in ses_backends[DEFAULT_ACCOUNT_ID][REGION].sent_messages]


def cluster_env(aws: AwsServer, slack_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a qcluster on the test database wired to moto and the Slack server."""
    values = {
        **aws.creds,
        "INBOUND_EMAIL_STORE": f"s3://{BUCKET}/{INTAKE}",
        "EMAIL_SENDER": "ses",
        # moto's GetSendQuota reports a sandbox account (1 mail/s): not what these tests pace.
        "NOTIFICATION_SEND_RATE": "1000",
        "SLACK_BOT_TOKEN": "xoxb-system-test",
        "SLACK_API_URL": slack_url,
        "Q_WORKERS": "2",
        "JOBS_LEASE_SECONDS": "3",
        "JOBS_HEARTBEAT_SECONDS": "0.5",
        "JOBS_EXTRA_HANDLER_MODULES": "tests.system.handlers",
        "CANONICAL_IDS_ROLE": "worker",
        "DEBUG": "true",
    }
    values.update(overrides)
    return child_env(**values)


def spawn_cluster(env: dict[str, str], log: Path) -> subprocess.Popen:
    """`manage.py qcluster` in its own process group (stop it with `stop_cluster`)."""
    return spawn_manage_py(
        "qcluster",
        env=env,
        start_new_session=True,
        stdout=open(log, "w"),  # noqa: SIM115 - the child owns it; closed when it exits
        stderr=subprocess.STDOUT,
    )


stop_cluster = stop_process_group
