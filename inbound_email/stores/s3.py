"""The S3 store: s3://bucket/prefix through boto3, where SES's receipt rule drops raw mail.

Listing is paginated (the old poller read one page of 50 keys, COR-19). Every boto3 error
becomes a StoreError that says whether a retry could help, and every call is bounded in time
and tries (a hung S3 must not outlive the poll task).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from http.client import HTTPException
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from inbound_email.conf import get_config
from inbound_email.exceptions import StoreError, StoreNotFound
from inbound_email.stores.base import StoredObject, safe_key, skip_key

logger = logging.getLogger(__name__)

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


READ_CHUNK_BYTES = 64 * 1024


def read_body(response: dict[str, Any], *, deadline: float, description: str) -> bytes:
    """The body of a GetObject answer, abandoned at `deadline` (time.monotonic()).

    botocore's read timeout bounds each socket read, not the body: a body that trickles in
    (a byte every few seconds) never trips it and could hold the poll for hours (issue 21).
    The body is read with `read1` (at most one socket read each, so one call returns within
    the read timeout) and the clock is checked between reads; past the deadline the read is
    abandoned as a transient StoreError, so the mail is retried after the backoff, never
    lost (its object stays in the intake). A body shorter than its Content-Length is an
    error too (botocore's own check is bypassed by reading the stream directly).
    """
    body = response["Body"]
    stream = getattr(body, "_raw_stream", body)  # botocore's StreamingBody wraps urllib3's
    read_once = getattr(stream, "read1", None) or stream.read
    expected = response.get("ContentLength")
    chunks: list[bytes] = []
    received = 0
    try:
        while True:
            if time.monotonic() > deadline:
                raise StoreError(
                    f"{description} abandoned at its total deadline "
                    f"(INBOUND_EMAIL_S3_READ_DEADLINE) after {received} of "
                    f"{expected if expected is not None else '?'} bytes: the body trickled in",
                    transient=True,
                )
            chunk = read_once(READ_CHUNK_BYTES)
            if not chunk:
                break
            chunks.append(chunk)
            received += len(chunk)
    finally:
        body.close()
    if expected is not None and received != int(expected):
        raise StoreError(
            f"{description}: {received} bytes received, {expected} announced", transient=True
        )
    return b"".join(chunks)


class S3Store:
    """s3://bucket/prefix through boto3 (credentials, region, AWS_ENDPOINT_URL from the env)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        quarantine_prefix: str,
        client=None,
        attachments_prefix: str = "attachments/",
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.quarantine_prefix = quarantine_prefix
        self.attachments_prefix = attachments_prefix
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
                    if skip_key(key, self.quarantine_prefix, self.attachments_prefix):
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
        started = time.monotonic()
        response = self._call(key, self.client.get_object, Bucket=self.bucket, Key=key)
        try:
            return read_body(
                response,
                deadline=started + get_config().s3_read_deadline,
                description=f"S3 read of {key}",
            )
        except (BotoCoreError, OSError, HTTPException) as exc:
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
