"""Mail stores: listing rules, quarantine moves, error classification, configuration."""

from __future__ import annotations

import json
import os

import boto3
import pytest
from django.utils import timezone
from moto.server import ThreadedMotoServer

from inbound_email.exceptions import InvalidStoreUrl, StoreError
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.intake import inbound_email_handle, inbound_email_register
from inbound_email.stores import (
    S3_MAX_ATTEMPTS,
    FolderStore,
    S3Store,
    StoredObject,
    store_from_url,
)
from tests.support.mail import build_mail
from tests.support.processes import child_env, manage_py
from tests.support.silent_server import SilentServer
from tests.support.stores import BUCKET, PREFIX
from tests.support.stores import key as intake_key
from tests.support.threads import run_side_by_side
from tests.support.trickle_server import TrickleServer


def keys(store) -> list[str]:
    return [o.key for page in store.list() for o in page]


def test_folder_store_lists_only_intake_mail(folder_store):
    for key in ["b", "a", "sub/c", ".incoming-partial", "AMAZON_SES_SETUP_NOTIFICATION"]:
        folder_store.put(key, b"x")
    folder_store.quarantine("a")
    assert keys(folder_store) == ["a", "b", "sub/c"]
    assert folder_store.get_quarantined("quarantine/a") == b"x"
    folder_store.delete("a")
    folder_store.delete("a")  # deleting twice is fine
    assert keys(folder_store) == ["b", "sub/c"]


def test_folder_store_refuses_keys_outside_its_folder(folder_store):
    with pytest.raises(StoreError):
        folder_store.get("../etc/passwd")


def test_folder_store_acts_on_a_symlink_never_on_the_file_it_names(folder_store):
    """A key names the entry: deleting a symlink "a" to another mail "b" deleted b (the key
    was resolved first) and left "a" dangling, skipped by every listing. Now the link is
    listed, refused on read, and deleted as itself; b is untouched."""
    folder_store.put("b", b"mail b")
    os.symlink("b", folder_store.root / "a")

    assert keys(folder_store) == ["a", "b"]
    with pytest.raises(StoreError, match="a is a symbolic link \\(to b\\): not read"):
        folder_store.get("a")
    folder_store.delete("a")

    assert keys(folder_store) == ["b"]
    assert folder_store.get("b") == b"mail b"


def test_s3_store_lists_pages_and_quarantines(s3_store):
    client = boto3.client("s3")
    for key in ["m1", "m2", "AMAZON_SES_SETUP_NOTIFICATION", "folder/"]:
        client.put_object(Bucket=BUCKET, Key=PREFIX + key, Body=b"mail")
    client.put_object(Bucket=BUCKET, Key="elsewhere/m3", Body=b"mail")
    assert keys(s3_store) == [PREFIX + "m1", PREFIX + "m2"]
    target = s3_store.quarantine(PREFIX + "m1")
    assert target == "quarantine/" + PREFIX + "m1"
    assert s3_store.get_quarantined(target) == b"mail"
    assert s3_store.delete_many([PREFIX + "m1", PREFIX + "m2"]) == {}
    assert keys(s3_store) == []


def test_s3_missing_bucket_is_a_store_error(s3_store):
    store = S3Store("no-such-bucket", "", "quarantine/")
    with pytest.raises(StoreError):
        keys(store)


@pytest.mark.parametrize("url", ["s3://", "https://bucket/x"])
def test_invalid_store_urls(url):
    with pytest.raises(InvalidStoreUrl):
        store_from_url(url)


def test_store_from_url(settings, tmp_path):
    store = store_from_url("s3://bucket/in/coming")
    assert (store.bucket, store.prefix) == ("bucket", "in/coming/")
    assert isinstance(store_from_url(str(tmp_path)), FolderStore)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_poll_command_against_moto_server_mode(aws_env, notification):
    """AWS_ENDPOINT_URL from the environment reaches boto3 (moto's server mode here)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(
            Bucket=BUCKET, Key=PREFIX + "m", Body=build_mail(token=notification.token, body="5")
        )
        result = manage_py(
            "poll_inbound_email",
            "--once",
            env=child_env(
                INBOUND_EMAIL_STORE=f"s3://{BUCKET}/{PREFIX}",
                AWS_ENDPOINT_URL=endpoint,
            ),
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1])["handled"] == 1
        assert InboundEmail.objects.get().status == "processed"
        assert client.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 0
    finally:
        server.stop()


@pytest.mark.django_db
def test_listing_pages_past_1000_keys_on_every_store(store, notification, settings):
    """I9, the second guard of pagination (issue 15): on S3 and on the folder store, a poll
    sees the keys after the first 1,000. 1,000 mails handled earlier (a failed delete left them
    in the intake) fill the first page; the new replies are all on the second."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 100
    done = [intake_key(store, f"k{i:04d}") for i in range(1000)]
    InboundEmail.objects.bulk_create(
        InboundEmail(store_key=k, status=InboundEmail.Status.PROCESSED) for k in done
    )
    for k in done:
        store.put(k, b"handled before")
    new = [intake_key(store, f"z{i:02d}") for i in range(40)]
    for k in new:
        store.put(k, build_mail(token=notification.token, body="4"))
    assert [len(page) for page in store.list()] == [1000, 40]

    summary = poll_once(store=store)

    assert summary.listed == 1040
    assert (summary.outcomes["cleaned_up"], summary.outcomes["processed"]) == (1000, 40)
    assert keys(store) == []
    assert InboundEmail.objects.filter(store_key__in=new, status="processed").count() == 40
    assert not InboundEmail.objects.filter(intake_deleted=False).exists()


def test_an_s3_endpoint_that_never_answers_is_a_transient_store_error_after_bounded_tries(
    settings, aws_env, monkeypatch
):
    """A hung S3 (the connection made, no answer) used botocore's defaults: 60 s per read and
    five tries, so one call could take five minutes, past the poll task's timeout, and the
    task was killed with nothing recorded. Each call now waits at most
    INBOUND_EMAIL_S3_TIMEOUT per try, tries S3_MAX_ATTEMPTS times, and becomes a transient
    StoreError (the poll logs it and tries again next run)."""
    settings.INBOUND_EMAIL_S3_TIMEOUT = 1
    with SilentServer() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        store = store_from_url(f"s3://{BUCKET}/{PREFIX}")
        # A hang guard, not a timing assertion: still running after 60 s is a TimeoutError.
        errors = run_side_by_side(lambda: keys(store), copies=1, timeout=60)
        connections = server.connections

    assert len(errors) == 1, errors
    assert isinstance(errors[0], StoreError) and errors[0].transient, errors
    assert connections == S3_MAX_ATTEMPTS


@pytest.mark.parametrize("where", ["folder", "s3-prefix", "s3-whole-bucket"])
def test_stored_attachments_are_never_listed_as_intake_mail(request, settings, where):
    """Issue 21.1: attachments live in the store under INBOUND_EMAIL_ATTACHMENTS_PREFIX; the
    poller must never take them for mail, also when the intake is the whole bucket."""
    if where == "folder":
        store = request.getfixturevalue("folder_store")
    else:
        request.getfixturevalue("s3_store")  # the moto bucket
        url = f"s3://{BUCKET}/{PREFIX.rstrip('/')}" if where == "s3-prefix" else f"s3://{BUCKET}"
        store = store_from_url(url)
    store.put(intake_key(store, "m"), b"mail")
    store.put("attachments/7/1-report.pdf", b"%PDF")
    assert keys(store) == [intake_key(store, "m")]
    assert store.get("attachments/7/1-report.pdf") == b"%PDF"


def test_an_s3_body_that_trickles_in_is_abandoned_at_the_total_deadline(
    settings, aws_env, monkeypatch
):
    """Issue 21: the read timeout bounds each read, and a body that sends a byte every 50 ms
    never trips it; the whole 100 KB would take over an hour. The read is abandoned at
    INBOUND_EMAIL_S3_READ_DEADLINE as a transient error (retried later, never lost)."""
    settings.INBOUND_EMAIL_S3_TIMEOUT = 5
    settings.INBOUND_EMAIL_S3_READ_DEADLINE = 1
    body = build_mail() + b"x" * 100_000
    with TrickleServer(body, chunk=1, interval=0.05) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        store = store_from_url(f"s3://{BUCKET}/{PREFIX}")
        # A hang guard, not a timing assertion: still reading after 60 s is a TimeoutError.
        errors = run_side_by_side(lambda: store.get(f"{PREFIX}m1"), copies=1, timeout=60)
        sent = server.bytes_sent

    assert len(errors) == 1, errors
    assert isinstance(errors[0], StoreError) and errors[0].transient, errors
    assert "total deadline" in str(errors[0])
    assert sent < len(body)  # abandoned, not read to the end


def test_an_s3_body_that_arrives_normally_is_read_whole_and_checked(settings, aws_env, monkeypatch):
    body = build_mail() + b"y" * 300_000
    with TrickleServer(body) as server:
        server.fast = True
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        store = store_from_url(f"s3://{BUCKET}/{PREFIX}")
        assert store.get(f"{PREFIX}m1") == body


@pytest.mark.django_db
def test_a_mail_whose_s3_body_trickles_is_retried_later_not_lost(
    settings, aws_env, monkeypatch, notification
):
    """The abandoned read counts as a transient failure: the row stays `received` with the
    error recorded and its object untouched; once S3 answers normally, the reply is handled."""
    settings.INBOUND_EMAIL_S3_TIMEOUT = 5
    settings.INBOUND_EMAIL_S3_READ_DEADLINE = 1
    raw = build_mail(token=notification.token, body="4")
    key = f"{PREFIX}slow"
    with TrickleServer(raw, chunk=1, interval=0.05) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        store = store_from_url(f"s3://{BUCKET}/{PREFIX}")
        row = inbound_email_register(objects=[StoredObject(key, len(raw), "trickle")])[key]

        first = inbound_email_handle(inbound_email_id=row.pk, store=store)
        row.refresh_from_db()
        assert (first.status, row.attempts) == (InboundEmail.Status.RECEIVED, 1)
        assert "total deadline" in row.last_error
        assert row.raw is None  # nothing half-read was kept as if it were the mail

        server.fast = True  # S3 recovered
        InboundEmail.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
        second = inbound_email_handle(inbound_email_id=row.pk, store=store)

    assert second.status == InboundEmail.Status.PROCESSED
    assert Reply.objects.get(inbound_email_id=row.pk).rating == 4


def _incoming(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".incoming-*"))


def test_a_folder_write_that_fails_at_the_rename_leaves_no_temp_file(folder_store):
    """Issue 28.1: each failed write used to leave its `.incoming-*` file behind (here the
    name is taken by a folder, so the final rename fails)."""
    (folder_store.root / "attachments" / "7" / "1-x.pdf").mkdir(parents=True)

    with pytest.raises(StoreError, match="writing attachments/7/1-x.pdf failed"):
        folder_store.put("attachments/7/1-x.pdf", b"%PDF")

    assert _incoming(folder_store.root) == []


def test_a_folder_name_too_long_for_the_file_system_is_a_permanent_error(folder_store):
    """ENAMETOOLONG will fail on every attempt: never counted as temporary."""
    with pytest.raises(StoreError) as error:
        folder_store.put("attachments/7/" + "x" * 256, b"%PDF")

    assert error.value.transient is False
    assert _incoming(folder_store.root) == []


_WRITE_OVER_THE_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from inbound_email.exceptions import StoreError
from inbound_email.stores.folder import FolderStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    FolderStore(Path(sys.argv[1]), "quarantine/").put("attachments/7/1-big.pdf", b"x" * 5000)
except StoreError as exc:
    print("refused:", exc)
"""


def test_a_folder_write_that_fails_half_way_leaves_no_temp_file(tmp_path):
    """The bytes cannot all be written (a full disk; here the process's file size limit, on
    the real file system, in a child process so the limit stays there)."""
    import subprocess
    import sys

    root = tmp_path / "mail"
    result = subprocess.run(
        [sys.executable, "-c", _WRITE_OVER_THE_FILE_SIZE_LIMIT, str(root)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert "refused: writing attachments/7/1-big.pdf failed" in result.stdout, result.stderr
    assert _incoming(root) == []
    assert not (root / "attachments" / "7" / "1-big.pdf").exists()
