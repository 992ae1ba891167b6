"""Hostile input: one odd key, file or mail never takes the whole poll down (adversarial review)."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection
from django.urls import reverse

from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once
from tests.support.mail import build_mail
from tests.support.processes import wait_until
from tests.support.stores import PREFIX, intake_keys

pytestmark = pytest.mark.django_db

Status = InboundEmail.Status


def test_a_file_name_that_is_not_utf8_does_not_stop_the_poll(folder_store, notification):
    """A file dropped with a Latin-1 name (b"caf\\xe9.eml") reaches Python as a lone surrogate,
    which PostgreSQL cannot store: registering the page raised UnicodeEncodeError and every
    poll died before handling any mail of the folder (or running the relay sweep)."""
    folder_store.put("good", build_mail(token=notification.token, body="Rating: 4"))
    root = os.fsencode(folder_store.root)
    with open(os.path.join(root, b"caf\xe9.eml"), "wb") as handle:
        handle.write(build_mail(token=notification.token, body="Rating: 5"))

    summary = poll_once()

    assert summary.list_error == ""
    good = InboundEmail.objects.get(store_key="good")
    assert good.status == Status.PROCESSED
    # The odd file is handled too, under its name with the odd byte escaped.
    odd = InboundEmail.objects.get(store_key="caf\\xe9.eml")
    assert (odd.status, odd.reason) == (Status.PROCESSED, "")
    assert odd.reply.rating == 5
    assert intake_keys(folder_store) == []


def test_a_non_utf8_file_name_never_overwrites_a_file_with_the_escaped_name(
    folder_store, notification
):
    """The rename to the escaped name never replaces an existing file: both mails survive."""
    root = os.fsencode(folder_store.root)
    folder_store.put("caf\\xe9.eml", build_mail(token=notification.token, body="Rating: 3"))
    with open(os.path.join(root, b"caf\xe9.eml"), "wb") as handle:
        handle.write(build_mail(token=notification.token, body="Rating: 5"))

    summary = poll_once()

    assert summary.list_error == ""
    assert InboundEmail.objects.get(store_key="caf\\xe9.eml").reply.rating == 3
    with open(os.path.join(root, b"caf\xe9.eml"), "rb") as handle:
        assert b"Rating: 5" in handle.read()  # left in place (logged) for an operator


def test_an_s3_key_with_a_nul_does_not_stop_the_poll(s3_store, notification):
    """S3 takes any UTF-8 in a key, NUL included ("characters that might require special
    handling"); PostgreSQL takes no NUL in text. Registering the page raised ValueError and
    every poll died before handling any mail of the bucket."""
    s3_store.put(PREFIX + "good", build_mail(token=notification.token, body="Rating: 4"))
    s3_store.put(PREFIX + "odd\x00.eml", build_mail(token=notification.token, body="Rating: 5"))

    summary = poll_once()

    assert summary.list_error == ""
    assert InboundEmail.objects.get(store_key=PREFIX + "good").status == Status.PROCESSED
    # The odd object is handled too, copied under its key with the NUL escaped.
    odd = InboundEmail.objects.get(store_key=PREFIX + "odd\\x00.eml")
    assert (odd.status, odd.reason) == (Status.PROCESSED, "")
    assert odd.reply.rating == 5
    assert intake_keys(s3_store) == []


def test_an_s3_key_with_a_nul_never_overwrites_an_object_with_the_escaped_key(
    s3_store, notification
):
    s3_store.put(PREFIX + "odd\\x00.eml", build_mail(token=notification.token, body="Rating: 3"))
    s3_store.put(PREFIX + "odd\x00.eml", build_mail(token=notification.token, body="Rating: 5"))

    summary = poll_once()

    assert summary.list_error == ""
    assert InboundEmail.objects.get(store_key=PREFIX + "odd\\x00.eml").reply.rating == 3
    assert b"Rating: 5" in s3_store.get(PREFIX + "odd\x00.eml")  # left in place (logged)


@pytest.mark.django_db(transaction=True)
def test_a_named_pipe_in_the_mail_folder_does_not_hang_the_poll(folder_store, notification):
    """A FIFO is listed by os.walk like a file; reading it blocks until someone writes to it,
    so the poll hung for good, holding the row lock and its transaction open."""
    folder_store.put("good", build_mail(token=notification.token, body="Rating: 4"))
    fifo = os.path.join(folder_store.root, "pipe")
    os.mkfifo(fifo)
    done = threading.Event()

    def poll() -> None:
        try:
            poll_once()
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        wait_until(done.is_set, "the poll to finish", timeout=30)
    finally:
        if not done.is_set():  # release the hung reader, so the test run can go on
            with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
                pass
        thread.join(30)
    assert InboundEmail.objects.get(store_key="good").status == Status.PROCESSED
    assert os.path.exists(fifo)  # not mail: left alone


def test_a_symlink_out_of_the_mail_folder_ends_quarantined_and_discard_removes_only_the_link(
    folder_store, notification, admin_client, tmp_path
):
    """A symlink in the mail folder pointing outside it was quarantined, but its quarantine
    copy was refused ("escapes the mail folder") on every poll, so it stayed in the intake,
    retried and logged forever; the admin's Discard failed the same way, so no operator could
    clear it. Now the link is never followed: it is quarantined once with the reason, moved
    out of the intake (as a link), and Discard removes the link, never the file it names."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"a file outside the mail folder\n")
    folder_store.put("good", build_mail(token=notification.token, body="Rating: 4"))
    os.symlink(outside, folder_store.root / "evil.eml")

    poll_once()

    row = InboundEmail.objects.get(store_key="evil.eml")
    assert row.status == Status.QUARANTINED
    assert f"evil.eml is a symbolic link (to {outside}): not read" in row.detail
    assert InboundEmail.objects.get(store_key="good").status == Status.PROCESSED
    assert intake_keys(folder_store) == []  # out of the intake: no poll retries it
    assert poll_once().listed == 0

    url = reverse("admin:inbound_email_inboundemail_changelist")
    response = admin_client.post(
        url, {"action": "discard", "_selected_action": [row.pk], "post": "yes"}, follow=True
    )

    assert "1 mail(s) discarded" in response.content.decode()
    row.refresh_from_db()
    assert row.status == Status.DISCARDED
    assert outside.read_bytes() == b"a file outside the mail folder\n"
    left = [p for p in folder_store.root.rglob("*") if p.is_symlink()]
    assert left == []  # the link itself is gone, from the intake and the quarantine


def test_a_rating_on_a_scale_of_thousands_of_digits_is_an_invalid_rating(
    folder_store, notification
):
    """int() refuses strings of more than 4,300 digits (ValueError, Python >= 3.11): the
    "Rating: 4/555…" of a PI's reply escaped the rating rules, and the whole mail, with the
    instruction under it, was quarantined as a permanent error. Now the rating is invalid
    (said on the reply) and the instruction is relayed."""
    body = "Rating: 4/" + "5" * 5000 + "\nPlease shorten the abstract."
    folder_store.put("m", build_mail(token=notification.token, body=body))

    poll_once()

    row = InboundEmail.objects.get(store_key="m")
    assert row.status == Status.AWAITING_RELAY
    assert row.reply.rating is None
    assert "not on a scale of 5" in row.reply.rating_error
    assert row.reply.instruction == "Please shorten the abstract."


def test_a_key_longer_than_the_ledger_holds_does_not_stop_the_poll(folder_store, notification):
    """A mail file nested deeper than 1,024 characters of path (the ledger's store_key): the
    page's INSERT failed on the too-long value and every poll died before handling any mail.
    It is renamed to a key that fits (a prefix of the old one plus a digest of it) and handled
    like any mail; the other mail of the page is handled as usual."""
    folder_store.put("good", build_mail(token=notification.token, body="Rating: 4"))
    deep = "/".join(["d" * 200] * 6) + "/reply.eml"  # 1,216 characters
    folder_store.put(deep, build_mail(token=notification.token, body="Rating: 5"))

    summary = poll_once()

    assert summary.list_error == ""
    assert InboundEmail.objects.get(store_key="good").status == Status.PROCESSED
    long_one = InboundEmail.objects.exclude(store_key="good").get()
    assert len(long_one.store_key) <= InboundEmail._meta.get_field("store_key").max_length
    assert long_one.store_key.startswith("d" * 200 + "/")
    assert (long_one.status, long_one.reply.rating) == (Status.PROCESSED, 5)
    assert intake_keys(folder_store) == []
