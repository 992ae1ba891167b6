"""Mail stores: where SES drops raw mail. One interface (`base.MailStore`), two adapters
(`s3.S3Store`, `folder.FolderStore`), and the configured one (`default_store`).

Callers import from here; the adapters' modules are an implementation detail.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from inbound_email.conf import get_config
from inbound_email.exceptions import InvalidStoreUrl
from inbound_email.stores.base import (
    KEY_MAX_CHARS,
    SES_SETUP_KEY,
    MailStore,
    StoredObject,
    safe_key,
    sha256_hex,
)
from inbound_email.stores.folder import FolderStore

# The S3 adapter is imported when first used, not with this package: boto3 and botocore take
# about 0.13 s of CPU to import, and every process that imports the inbound-mail services
# (each `manage.py` command, each qcluster, the web app through the admin) paid it, most of
# them on a folder store that never calls S3 (docs/setup.md, the suite's time budget).
_S3_NAMES = frozenset({"S3_MAX_ATTEMPTS", "S3Store", "s3_client"})


def __getattr__(name: str) -> Any:
    """`S3Store`, `s3_client` and `S3_MAX_ATTEMPTS` from the S3 adapter, imported on first use."""
    if name in _S3_NAMES:
        return getattr(importlib.import_module("inbound_email.stores.s3"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "KEY_MAX_CHARS",
    "S3_MAX_ATTEMPTS",
    "SES_SETUP_KEY",
    "FolderStore",
    "MailStore",
    "S3Store",
    "StoredObject",
    "default_store",
    "parse_store_url",
    "s3_client",
    "safe_key",
    "sha256_hex",
    "store_from_url",
]


# S3's bucket naming rules (3-63 characters: lower-case letters, digits, dots, hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def parse_store_url(url: str) -> tuple[str, str, str]:
    """INBOUND_EMAIL_STORE as ("s3", bucket, prefix ending in "/" or "") or ("folder", path,
    ""); InvalidStoreUrl names the variable and the expected forms. A value that looks like a
    URL but is not s3://bucket/prefix (s3:/bucket, ftp://...) is refused, not taken for a
    folder of that name."""
    usage = "use s3://bucket/prefix or a folder path"
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not _BUCKET.match(bucket):
            raise InvalidStoreUrl(
                f"INBOUND_EMAIL_STORE={url!r} does not name an S3 bucket: {usage}"
            )
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return "s3", bucket, prefix
    if "://" in url or _SCHEME.match(url):
        raise InvalidStoreUrl(f"INBOUND_EMAIL_STORE={url!r} is not a store: {usage}")
    return "folder", url, ""


def store_from_url(url: str | None = None) -> MailStore:
    """The store named by INBOUND_EMAIL_STORE: s3://bucket/prefix or a folder path."""
    config = get_config()
    url = url if url is not None else config.store_url
    quarantine_prefix = config.quarantine_prefix
    kind, where, prefix = parse_store_url(url)
    if kind == "s3":
        from inbound_email.stores.s3 import S3Store

        return S3Store(
            where, prefix, quarantine_prefix, attachments_prefix=config.attachments_prefix
        )
    return FolderStore(Path(where), quarantine_prefix, config.attachments_prefix)


_default_cache: dict[tuple[str, str, str], MailStore] = {}


def default_store() -> MailStore:
    """The configured store, built once per process (a boto3 client is costly to create)."""
    config = get_config()
    cache_key = (config.store_url, config.quarantine_prefix, config.attachments_prefix)
    store = _default_cache.get(cache_key)
    if store is None:
        store = _default_cache[cache_key] = store_from_url()
    return store
