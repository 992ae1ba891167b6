"""SNS's signing certificates for /ses/events (issue 28.3): which URLs may sign, and fetching
them at bounded cost.

Only an SNS endpoint of a real region may sign: `https://sns.<region>.amazonaws.com/….pem`,
`….amazonaws.com.cn` for the China regions (and only for them), the GovCloud regions too.
The region must have a region's shape (`us-east-1`, `cn-north-1`, `us-gov-west-1`): the
looser `sns.<any label>.amazonaws.com` that most validators use also matches S3's bucket
hosts (`sns.s3.amazonaws.com`, `sns.s3-accelerate…`, `sns.s3-us-west-2…`), where whoever owns
a bucket named "sns" could serve a certificate of their own. Java's AWS SDK builds the host
from the region list for the same reason.

Cost: a request that names a certificate costs a dictionary look-up when the URL was fetched
before (kept until the certificate expires, at most `_MAX_CACHED` URLs) or failed in the last
SES_EVENTS_CERT_FAILURE_CACHE_SECONDS (answered 503 at once: SNS retries). Otherwise one
fetch, bounded by SES_EVENTS_FETCH_DEADLINE_SECONDS in all and 64 KiB, one at a time per
process, and at most SES_EVENTS_CERT_FETCHES_PER_MINUTE of them per process: past that a
request naming yet another URL is answered 503 without a fetch (forged messages can name any
number of made-up URLs on the SNS hosts; the genuine certificate stays cached meanwhile).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict, deque
from datetime import UTC, datetime
from urllib.parse import urlsplit

from cryptography import x509

from notifications.bounded_fetch import FetchFailed, fetch
from notifications.conf import get_config
from notifications.exceptions import SnsMessageRefused

logger = logging.getLogger(__name__)

# sns.<region>.amazonaws.com[.cn]: a region is <2 letters>[-gov]-<direction>-<number>.
_SNS_HOST = re.compile(
    r"^sns\.(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-[1-9][0-9]?)\.amazonaws\.com(?P<cn>\.cn)?$"
)
MAX_CERT_BYTES = 64 * 1024
_MAX_CACHED = 64  # certificate URLs kept (SNS uses a handful per region and rotates rarely)

_lock = threading.Lock()  # guards the caches and the budget
_fetching = threading.Lock()  # one fetch at a time per process
_certificates: OrderedDict[str, x509.Certificate] = OrderedDict()
_failures: dict[str, tuple[float, str]] = {}  # url -> (monotonic time it ends, why)
_fetch_times: deque[float] = deque()


def is_sns_host(host: str) -> bool:
    """True for `sns.<region>.amazonaws.com` (`.amazonaws.com.cn` for a cn- region)."""
    match = _SNS_HOST.match(host)
    return bool(match) and match["region"].startswith("cn-") == bool(match["cn"])


def on_sns_endpoint(url: str, *, path: str | None = None) -> bool:
    """https on an SNS host, with no port, user or fragment (and the given path shape)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme != "https" or port is not None or "@" in parts.netloc or parts.fragment:
        return False
    if path is not None and not re.fullmatch(path, parts.path):
        return False
    return is_sns_host(parts.netloc)


def signing_cert_url_allowed(url: str) -> bool:
    """A `.pem` on an SNS endpoint, or one of SES_EVENTS_TRUSTED_CERT_URLS (tests only)."""
    if url in get_config().ses_events_trusted_cert_urls:
        return True
    return on_sns_endpoint(url, path=r"/[A-Za-z0-9._-]+\.pem") and not urlsplit(url).query


def forget_certificates() -> None:
    """Empty the caches and the fetch budget (tests; a process starts with them empty)."""
    with _lock:
        _certificates.clear()
        _failures.clear()
        _fetch_times.clear()


def signing_certificate(url: str) -> x509.Certificate:
    """The certificate at `url`, cached; SnsMessageRefused (400 for a URL that may not sign,
    503 when it cannot be had now)."""
    if not signing_cert_url_allowed(url):
        raise SnsMessageRefused(400, f"signing certificate not from an SNS host: {url[:200]!r}")
    cached = _cached(url)
    if cached is not None:
        return cached
    with _fetching:
        cached = _cached(url)  # fetched by the request this one waited for
        if cached is not None:
            return cached
        _spend_budget(url)
        try:
            pem = fetch(
                url,
                deadline_seconds=get_config().ses_events_fetch_deadline_seconds,
                max_bytes=MAX_CERT_BYTES,
            )
            certificate = x509.load_pem_x509_certificate(pem)
        except (FetchFailed, ValueError) as exc:
            reason = f"signing certificate unavailable: {exc}"
            _remember_failure(url, reason)
            raise SnsMessageRefused(503, reason) from exc
    with _lock:
        _certificates[url] = certificate
        while len(_certificates) > _MAX_CACHED:
            _certificates.popitem(last=False)
    return certificate


def _cached(url: str) -> x509.Certificate | None:
    """The cached certificate; raises the cached failure while it lasts."""
    with _lock:
        certificate = _certificates.get(url)
        if certificate is not None:
            if certificate.not_valid_after_utc > datetime.now(UTC):
                _certificates.move_to_end(url)
                return certificate
            del _certificates[url]  # expired: SNS has moved on to a new one
        failure = _failures.get(url)
        if failure is not None:
            if failure[0] > time.monotonic():
                raise SnsMessageRefused(503, f"{failure[1]} (cached)")
            del _failures[url]
    return None


def _spend_budget(url: str) -> None:
    now = time.monotonic()
    with _lock:
        while _fetch_times and _fetch_times[0] <= now - 60:
            _fetch_times.popleft()
        if len(_fetch_times) >= get_config().ses_events_cert_fetches_per_minute:
            raise SnsMessageRefused(503, "too many new signing certificate URLs: try again later")
        _fetch_times.append(now)


def _remember_failure(url: str, reason: str) -> None:
    seconds = get_config().ses_events_cert_failure_cache_seconds
    with _lock:
        if len(_failures) >= _MAX_CACHED:  # made-up URLs must not grow it without bound
            _failures.pop(next(iter(_failures)))
        _failures[url] = (time.monotonic() + seconds, reason)
    logger.warning(
        "SNS signing certificate %s: %s",
        url[:200],
        reason,
        extra={"action": "sns_certificate_unavailable"},
    )
