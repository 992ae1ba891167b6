"""Mail stores: where SES drops raw mail. One interface, two adapters (S3, a local folder).

The poller only lists, reads, moves to quarantine and deletes; it never knows which store it
talks to. Listing is paginated (the old poller read one page of 50 keys, COR-19) and skips
SES's setup-notification object, folder placeholder keys and the quarantine prefix.
Every adapter error becomes a StoreError that says whether a retry could help.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISLNK, S_ISREG
from typing import Any, Protocol

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from inbound_email.conf import get_config
from inbound_email.exceptions import InvalidStoreUrl, StoreError, StoreNotFound

logger = logging.getLogger(__name__)

SES_SETUP_KEY = "AMAZON_SES_SETUP_NOTIFICATION"
_TRANSIENT_S3_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
}


# Tries per S3 call (botocore's "standard" retry mode: throttling, 5xx and connection errors,
# with its own jittered backoff). With INBOUND_EMAIL_S3_TIMEOUT per try, one call to a hung
# S3 gives up after about 3 x 20 s, inside the poll task's 300 s, and becomes a transient
# StoreError the poll logs; the next run tries again.
S3_MAX_ATTEMPTS = 3


def s3_client(timeout: float) -> Any:
    """A boto3 S3 client whose calls cannot hang (credentials, region and AWS_ENDPOINT_URL
    come from boto3's standard environment)."""
    return boto3.client(
        "s3",
        config=BotoConfig(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"total_max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        ),
    )


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


class MailStore(Protocol):
    description: str

    def list(self) -> Iterator[list[StoredObject]]:
        """Pages of intake objects (at most 1,000 per page), in key order."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...

    def quarantine(self, key: str) -> str:
        """Copy the object to the quarantine prefix and return its quarantine key."""

    def get_quarantined(self, quarantine_key: str) -> bytes: ...

    def delete(self, key: str) -> None:
        """Delete an intake (or quarantine) object; deleting a missing object is not an error."""

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        """Delete several objects; return {key: error} for those that failed."""

    def exists(self, key: str) -> bool: ...


# The longest key the ledger holds (InboundEmail.store_key's max_length): a longer one made
# the page's INSERT fail and with it every poll.
KEY_MAX_CHARS = 1024
_DIGEST_CHARS = 16


def safe_key(key: str) -> str:
    """`key` as text the ledger can hold: PostgreSQL takes no NUL and no lone surrogate, and
    store_key no more than KEY_MAX_CHARS.

    A file name that is not UTF-8 reaches Python with each odd byte as a lone surrogate
    (os.walk's surrogateescape); here those bytes, and any NUL, become backslash escapes
    (a Latin-1 "café.eml" becomes the key `caf\\xe9.eml`). A key still too long keeps its
    beginning and ends in "~" and a digest of the whole, so two long keys stay apart. Any
    other key is unchanged.
    """
    try:
        data = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is not an escaped byte
        data = key.encode("utf-8", "backslashreplace")
    text = data.decode("utf-8", "backslashreplace").replace("\x00", "\\x00")
    if len(text) > KEY_MAX_CHARS:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
        text = text[: KEY_MAX_CHARS - _DIGEST_CHARS - 1].rstrip("/") + "~" + digest
    return text


def _skip(key: str, quarantine_prefix: str) -> bool:
    name = PurePosixPath(key).name
    return (
        key.endswith("/")
        or name == SES_SETUP_KEY
        or name.startswith(".")
        or (bool(quarantine_prefix) and key.startswith(quarantine_prefix))
    )


class S3Store:
    """s3://bucket/prefix through boto3 (credentials, region, AWS_ENDPOINT_URL from the env)."""

    def __init__(self, bucket: str, prefix: str, quarantine_prefix: str, client=None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.quarantine_prefix = quarantine_prefix
        self.client = client or s3_client(get_config().s3_timeout)
        self.description = f"s3://{bucket}/{prefix}"

    def _error(self, exc: Exception, key: str) -> StoreError:
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in {"NoSuchKey", "404", "NotFound"}:
                return StoreNotFound(f"{self.description}: {key} not found")
            return StoreError(f"S3 {code} on {key}: {exc}", transient=code in _TRANSIENT_S3_CODES)
        return StoreError(f"S3 error on {key}: {exc}", transient=True)

    def _call(self, key: str, fn, **kwargs):
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, key) from exc

    def list(self) -> Iterator[list[StoredObject]]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket, Prefix=self.prefix, PaginationConfig={"PageSize": 1000}
        )
        try:
            for page in pages:
                listed = []
                for o in page.get("Contents", []):
                    key = o["Key"]
                    if _skip(key, self.quarantine_prefix):
                        continue
                    if safe_key(key) != key:
                        renamed = self._rename_to_safe_key(key)
                        if renamed is None:
                            continue
                        key = renamed
                    etag = str(o.get("ETag", "")).strip('"')
                    listed.append(StoredObject(key, int(o.get("Size", 0)), etag))
                yield listed
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, self.prefix) from exc

    def _rename_to_safe_key(self, key: str) -> str | None:
        """Copy an object whose key the ledger cannot hold (a NUL, too long) to its `safe_key`, then
        delete it; the new key, or None (logged; the object stays as it is) when another
        object has that key or S3 refused. A copy whose delete failed is copied again on the
        next poll, which is harmless: the ledger row of the new key is the one that counts."""
        new_key = safe_key(key)
        try:
            if self.exists(new_key):
                logger.error(
                    "S3 key %s: the key as listed cannot be stored (a NUL, or too long) and "
                    "%s is taken: left in place, not polled",
                    new_key,
                    new_key,
                    extra={"action": "inbound_key_unsafe", "mail_key": new_key},
                )
                return None
            self._copy(key, new_key)
            self.delete(key)
        except StoreError as exc:
            logger.error(
                "S3 key %s: the key as listed cannot be stored (a NUL, or too long) and "
                "could not be renamed: %s",
                new_key,
                exc,
                extra={"action": "inbound_key_unsafe", "mail_key": new_key},
            )
            return None
        logger.warning(
            "S3 object renamed to %s: its key could not be stored (a NUL, or too long)",
            new_key,
            extra={"action": "inbound_key_renamed", "mail_key": new_key},
        )
        return new_key

    def get(self, key: str) -> bytes:
        response = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)
        try:
            return response["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise StoreError(f"S3 read of {key} failed: {exc}", transient=True) from exc

    get_quarantined = get

    def put(self, key: str, data: bytes) -> None:
        self._call(key, self.client.put_object, Bucket=self.bucket, Key=key, Body=data)

    def quarantine(self, key: str) -> str:
        target = self.quarantine_prefix + key
        self._copy(key, target)
        return target

    def _copy(self, key: str, target: str) -> None:
        """Copy `key` to `target` in the bucket (server side)."""
        self._call(
            key,
            self.client.copy_object,
            Bucket=self.bucket,
            Key=target,
            CopySource={"Bucket": self.bucket, "Key": key},
        )

    def delete(self, key: str) -> None:
        self._call(key, self.client.delete_object, Bucket=self.bucket, Key=key)

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        failed: dict[str, str] = {}
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            chunk = keys[start : start + 1000]
            response = self._call(
                chunk[0],
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
            )
            for error in response.get("Errors", []):
                failed[error.get("Key", "")] = f"{error.get('Code')}: {error.get('Message')}"
        return failed

    def exists(self, key: str) -> bool:
        try:
            self._call(key, self.client.head_object, Bucket=self.bucket, Key=key)
        except StoreNotFound:
            return False
        return True


class FolderStore:
    """A local folder: the embedded default. Keys are paths relative to the folder.

    Writers should write to a dot-file and rename it, so a half-written file is never listed.
    A key names a directory entry, never what a symlink points to: a symlink is listed (so its
    row ends quarantined with the reason) but never read, and it is moved and deleted as the
    link itself, never its target, which may be outside the folder or another mail.
    """

    def __init__(self, root: Path, quarantine_prefix: str) -> None:
        self.root = Path(root)
        self.quarantine_prefix = quarantine_prefix.strip("/") + "/" if quarantine_prefix else ""
        self.description = str(self.root)

    def _path(self, key: str) -> Path:
        """The entry `key` names: its directory resolved and inside the folder, its last part
        not followed (resolving it too sent a delete of a symlink to the file it names)."""
        root = self.root.resolve()
        path = root / key
        parent = path.parent.resolve()
        if path.name in ("", ".", "..") or (parent != root and root not in parent.parents):
            raise StoreError(f"key {key!r} escapes the mail folder", transient=False)
        return parent / path.name

    def _link_error(self, key: str, path: Path) -> StoreError:
        """A symlink is not read: its target may be anything (outside the folder, another
        mail, a device). Permanent, naming the target for the operator."""
        try:
            target = safe_key(os.readlink(path))
        except OSError:
            target = "?"
        return StoreError(f"{key} is a symbolic link (to {target}): not read", transient=False)

    def list(self) -> Iterator[list[StoredObject]]:
        if not self.root.is_dir():
            return
        page: list[StoredObject] = []
        try:
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames.sort()
                for name in sorted(filenames):
                    path = Path(dirpath) / name
                    key = path.relative_to(self.root).as_posix()
                    if _skip(key, self.quarantine_prefix):
                        continue
                    if safe_key(key) != key:
                        renamed = self._rename_to_safe_key(path, key)
                        if renamed is None:
                            continue
                        path, key = renamed
                    try:
                        stat = path.lstat()
                    except FileNotFoundError:
                        continue  # handled and deleted by another poller meanwhile
                    if not (S_ISREG(stat.st_mode) or S_ISLNK(stat.st_mode)):
                        # A named pipe would block its reader (the poll) for good; a socket
                        # or device is not mail either. Left alone, and said.
                        logger.warning(
                            "%s in the mail folder is not a regular file: not polled",
                            key,
                            extra={"action": "inbound_not_a_file", "mail_key": key},
                        )
                        continue
                    page.append(
                        StoredObject(key, stat.st_size, f"{stat.st_mtime_ns}-{stat.st_size}")
                    )
                    if len(page) == 1000:
                        yield page
                        page = []
        except OSError as exc:
            raise StoreError(f"listing {self.root} failed: {exc}", transient=True) from exc
        if page:
            yield page

    def _rename_to_safe_key(self, path: Path, key: str) -> tuple[Path, str] | None:
        """Give a file whose name the ledger cannot hold (not UTF-8, too long) its `safe_key` name.

        Never overwrites: the file is hard-linked under the new name, then the old name is
        removed. None (the file stays as it is, logged) when another file has the new name or
        the rename failed; a file another poller renamed meanwhile is simply not listed here.
        """
        new_key = safe_key(key)
        target = self.root / new_key
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except FileExistsError:
                if not os.path.samefile(path, target):  # a third file: keep both untouched
                    logger.error(
                        "mail file %s: its name cannot be stored (not UTF-8, or too long) "
                        "and %s is taken: left in place, not polled",
                        new_key,
                        new_key,
                        extra={"action": "inbound_key_unsafe", "mail_key": new_key},
                    )
                    return None
            path.unlink()
        except FileNotFoundError:
            return None  # renamed (or handled) by another poller meanwhile
        except OSError as exc:
            logger.error(
                "mail file %s: its name cannot be stored (not UTF-8, or too long) and "
                "could not be renamed: %s",
                new_key,
                exc,
                extra={"action": "inbound_key_unsafe", "mail_key": new_key},
            )
            return None
        logger.warning(
            "mail file renamed to %s: its name could not be stored (not UTF-8, or too long)",
            new_key,
            extra={"action": "inbound_key_renamed", "mail_key": new_key},
        )
        return target, new_key

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            # O_NONBLOCK: opening a named pipe put there since the listing must not block.
            # O_NOFOLLOW: a symlink is refused (ELOOP), never read through.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                if not S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise StoreError(f"{key} is not a regular file", transient=False)
                return handle.read()
        except FileNotFoundError as exc:
            if not self.root.is_dir():  # unmounted, say: the mail is not known to be gone
                raise StoreError(
                    f"reading {key} failed: the mail folder {self.root} is missing",
                    transient=True,
                ) from exc
            raise StoreNotFound(f"{key} not found in {self.root}") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._link_error(key, path) from exc
            raise StoreError(f"reading {key} failed: {exc}", transient=True) from exc

    get_quarantined = get

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            raise StoreError(f"writing {key} failed: {exc}", transient=True) from exc

    def quarantine(self, key: str) -> str:
        """Copy the entry to the quarantine prefix: a file's bytes, a symlink as a link with
        the same target (it cannot be read, and must leave the intake all the same)."""
        target = self.quarantine_prefix + key
        path = self._path(key)
        try:
            link = os.readlink(path)
        except FileNotFoundError as exc:
            raise StoreNotFound(f"{key} not found in {self.root}") from exc
        except OSError:  # not a symlink (EINVAL): the mail's bytes
            self.put(target, self.get(key))
            return target
        copy = self._path(target)
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.unlink(missing_ok=True)
            os.symlink(link, copy)
        except OSError as exc:
            raise StoreError(f"quarantining the link {key} failed: {exc}", transient=True) from exc
        return target

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"deleting {key} failed: {exc}", transient=True) from exc

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        failed: dict[str, str] = {}
        for key in keys:
            try:
                self.delete(key)
            except StoreError as exc:
                failed[key] = str(exc)
        return failed

    def exists(self, key: str) -> bool:
        """Whether the entry is there (a file, or a symlink whatever it points to)."""
        path = self._path(key)
        return path.is_symlink() or path.is_file()


def store_from_url(url: str | None = None) -> MailStore:
    """The store named by INBOUND_EMAIL_STORE: s3://bucket/prefix or a folder path."""
    config = get_config()
    url = url if url is not None else config.store_url
    quarantine_prefix = config.quarantine_prefix
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise InvalidStoreUrl(f"INBOUND_EMAIL_STORE={url!r}: use s3://bucket/prefix")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return S3Store(bucket, prefix, quarantine_prefix)
    if "://" in url:
        raise InvalidStoreUrl(f"INBOUND_EMAIL_STORE={url!r}: use s3://bucket/prefix or a folder")
    return FolderStore(Path(url), quarantine_prefix)


_default_cache: dict[tuple[str, str], MailStore] = {}


def default_store() -> MailStore:
    """The configured store, built once per process (a boto3 client is costly to create)."""
    config = get_config()
    cache_key = (config.store_url, config.quarantine_prefix)
    store = _default_cache.get(cache_key)
    if store is None:
        store = _default_cache[cache_key] = store_from_url()
    return store


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
