"""Issue 28.1: an attachment's name never costs the PI's reply.

A PDF named with 95 Chinese characters (285 bytes of UTF-8) was cut to 255 bytes, losing
`.pdf`; stored as `1-<name>` (257 bytes) the folder store failed with "file name too long"
on every attempt, the failure counted as temporary, and the reply ended quarantined
`too_many_attempts`, never recorded nor relayed, with a `.incoming-*` file left per attempt.
Now the stored key's last part is at most 255 bytes with the extension kept, and a store
write that fails for any reason leaves the attachment "kept in raw" with the reason while
the reply is recorded and relayed.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import boto3
import pytest
from moto import settings as moto_settings
from moto.core.authorization import ActionAuthenticatorMixin

from canonical_ids.models import Message
from inbound_email import stores
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.poller import poll_once
from tests.inbound_email.services.test_relay import relay_until_settled, responded
from tests.support.mail import PDF, build_mail, with_attachments
from tests.support.stores import BUCKET, key

State = ReplyAttachment.State
NAME_MAX_BYTES = 255  # what a file system takes as one name (ext4, APFS, NTFS in UTF-16)

# Names whose UTF-8 runs past 255 bytes: the stem is cut, the extension kept.
CHINESE = "\u7814\u7a76\u8ba1\u5212\u4e66" * 19  # 95 characters, 285 bytes
CYRILLIC = "\u0417\u0430\u044f\u0432\u043a\u0430" * 22  # 132 characters, 264 bytes
EMOJI = "\U0001f4c4\U0001f52c" * 33  # 66 characters of 4 bytes each, 264 bytes
# Characters with two combining marks each (no precomposed form): cut inside a sequence, the
# name would end in a bare character that lost its marks.
COMBINING = "\u4e2d\u0301\u0323" * 40  # 120 characters, 280 bytes


def _pdf_reply(store, notification, filename: str) -> bytes:
    raw = build_mail(
        token=notification.token,
        body="Please see my comments attached.",
        attach=with_attachments(pdf_name=filename),
    )
    store.put(key(store, "m"), raw)
    return raw


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".incoming-")]


@pytest.mark.django_db(transaction=True)
def test_a_pdf_named_with_95_chinese_characters_no_longer_loses_the_reply(
    folder_store, notification
):
    """The reproduction: on main this mail ended quarantined `too_many_attempts`."""
    _pdf_reply(folder_store, notification, CHINESE + ".pdf")

    for _ in range(3):  # INBOUND_EMAIL_MAX_ATTEMPTS in these tests
        poll_once()
    relay_until_settled()

    mail = InboundEmail.objects.get()
    assert (mail.status, mail.reason) == (InboundEmail.Status.PROCESSED, "")
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.INBOXED
    attachment = reply.attachments.get()
    assert attachment.state == State.STORED
    assert attachment.filename.endswith(".pdf")
    assert folder_store.get(attachment.store_key) == PDF
    assert responded(notification)
    assert "Please see my comments attached." in Message.objects.get().text
    assert _temp_files(folder_store.root) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "stem",
    [CHINESE, CYRILLIC, EMOJI, COMBINING],
    ids=["chinese", "cyrillic", "emoji", "combining"],
)
def test_a_long_name_in_any_script_is_stored_within_255_bytes_with_its_extension(
    store, notification, stem
):
    _pdf_reply(store, notification, stem + ".pdf")

    poll_once()

    attachment = Reply.objects.get().attachments.get()
    assert attachment.state == State.STORED
    last_part = attachment.store_key.rpartition("/")[2]
    assert last_part == f"1-{attachment.filename}"
    assert len(last_part.encode("utf-8")) <= NAME_MAX_BYTES
    kept = attachment.filename.removesuffix(".pdf")
    assert attachment.filename.endswith(".pdf") and stem.startswith(kept)
    # Never cut inside a combining sequence: what follows the kept part starts a new one.
    assert unicodedata.combining(stem[len(kept)]) == 0
    # Only as much is cut as must be: the next sequence (a character and its marks) would
    # not fit.
    end = len(kept) + 1
    while end < len(stem) and unicodedata.combining(stem[end]):
        end += 1
    assert len(f"1-{stem[:end]}.pdf".encode()) > NAME_MAX_BYTES
    assert store.get(attachment.store_key) == PDF
    assert attachment.sha256 == hashlib.sha256(PDF).hexdigest()


@pytest.mark.django_db(transaction=True)
def test_a_store_write_that_fails_keeps_the_attachment_in_raw_and_the_reply_goes_through(
    folder_store, notification, settings
):
    """The attachments' folder cannot be made (a plain file stands where it should be): the
    write fails on the real file system. The reply is recorded and relayed at once, the
    attachment recorded as kept in the raw mail with the reason, and the raw is kept."""
    settings.INBOUND_EMAIL_ATTACHMENTS_PREFIX = ".attachments/"
    root = folder_store.root
    root.mkdir(parents=True, exist_ok=True)
    (root / ".attachments").write_bytes(b"not a folder")  # a dot-file: never listed as mail
    raw = _pdf_reply(folder_store, notification, "comments.pdf")

    poll_once()
    relay_until_settled()

    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.attempts == 1
    assert bytes(mail.raw) == raw  # the attachment is only there
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.INBOXED
    attachment = reply.attachments.get()
    assert (attachment.state, attachment.store_key) == (State.NOT_STORED, "")
    assert attachment.get_state_display() == "Kept in raw, the store write failed"
    assert "writing .attachments/" in attachment.store_error
    assert attachment.sha256 == hashlib.sha256(PDF).hexdigest()
    text = Message.objects.get().text
    assert "Please see my comments attached." in text
    assert "comments.pdf" in text and "Kept in raw, the store write failed" in text
    assert responded(notification)
    assert _temp_files(root) == []


@pytest.fixture
def s3_refusing_attachments(s3_store, monkeypatch):
    """The worker's IAM user may read, list and delete the intake but not write under
    attachments/ (a policy not updated for the attachments prefix): moto with its IAM
    authorisation on answers AccessDenied to that PutObject, as S3 does."""
    iam = boto3.client("iam")
    iam.create_user(UserName="worker")
    iam.put_user_policy(
        UserName="worker",
        PolicyName="inbound",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                    {
                        "Effect": "Deny",
                        "Action": "s3:PutObject",
                        "Resource": f"arn:aws:s3:::{BUCKET}/attachments/*",
                    },
                ],
            }
        ),
    )
    access_key = iam.create_access_key(UserName="worker")["AccessKey"]

    def authorise() -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", access_key["SecretAccessKey"])
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
        monkeypatch.setattr(moto_settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it keeps the credentials read
        stores._default_cache.clear()  # the poller's client signs with the worker's key

    return authorise


@pytest.mark.django_db(transaction=True)
def test_an_s3_write_that_is_refused_keeps_the_attachment_in_raw_and_the_reply_goes_through(
    s3_store, s3_refusing_attachments, notification
):
    raw = _pdf_reply(s3_store, notification, "comments.pdf")
    s3_refusing_attachments()

    poll_once()
    relay_until_settled()

    mail = InboundEmail.objects.get()
    assert mail.status == InboundEmail.Status.PROCESSED and mail.attempts == 1
    assert bytes(mail.raw) == raw
    reply = Reply.objects.get()
    assert reply.relay_status == Reply.RelayStatus.INBOXED
    attachment = reply.attachments.get()
    assert (attachment.state, attachment.store_key) == (State.NOT_STORED, "")
    assert "AccessDenied" in attachment.store_error
    assert "comments.pdf" in Message.objects.get().text
    assert responded(notification)
