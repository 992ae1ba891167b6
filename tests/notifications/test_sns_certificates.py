"""Issue 28.3: only real SNS signs. The signing certificate must come from an SNS endpoint of
a real region's shape (never an S3 bucket named "sns"), fetches are bounded and cached (a
failure too, briefly), and a request without a valid signature costs at most one cached
look-up. Signed with the local test certificate (tests/support/sns.py)."""

from __future__ import annotations

import json

import pytest

from notifications import bounded_fetch, sns_certificates
from notifications.models import DeliveryFeedback
from tests.support import lockstep_server
from tests.support.lockstep_server import LockstepServer
from tests.support.silent_server import SilentServer
from tests.support.sns import ses_bounce
from tests.support.trickle_server import TrickleServer

pytestmark = pytest.mark.django_db
URL = "/ses/events"

REAL_SNS_URLS = [
    "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.eu-central-2.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.ap-southeast-3.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
    "https://sns.cn-northwest-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
    "https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.il-central-1.amazonaws.com/SimpleNotificationService-abc.pem",
]
NOT_SNS_URLS = [
    # S3 answers on these hosts: whoever owns a bucket named "sns" could serve a certificate.
    "https://sns.s3.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.s3-accelerate.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.s3-us-west-2.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.s3-website-us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.s3.dualstack.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.execute-api.amazonaws.com/SimpleNotificationService-abc.pem",
    # Not a region, wrong partition, or not https / not a certificate / not the default port.
    "https://sns.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.us-east-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
    "https://sns.cn-north-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.txt",
    "https://sns.us-east-1.amazonaws.com:8443/SimpleNotificationService-abc.pem",
    "https://user@sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
    "https://sns.us-east-1.amazonaws.com.evil.example/SimpleNotificationService-abc.pem",
    "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
    "https://[sns.us-east-1.amazonaws.com/x.pem",
    "",
]


def _post(client, message):
    return client.post(URL, data=json.dumps(message), content_type="text/plain; charset=UTF-8")


@pytest.mark.parametrize("url", REAL_SNS_URLS)
def test_sns_endpoints_of_every_partition_may_sign(url, settings):
    settings.SES_EVENTS_TRUSTED_CERT_URLS = []
    assert sns_certificates.signing_cert_url_allowed(url)


@pytest.mark.parametrize("url", NOT_SNS_URLS)
def test_bucket_style_and_other_hosts_may_not_sign(url, settings):
    """Fails if the host check is loosened to any `….amazonaws.com` (issue 28.7)."""
    settings.SES_EVENTS_TRUSTED_CERT_URLS = []
    assert not sns_certificates.signing_cert_url_allowed(url)


@pytest.mark.parametrize(
    "host",
    ["sns.s3.amazonaws.com", "sns.s3-accelerate.amazonaws.com", "sns.s3-us-west-2.amazonaws.com"],
)
def test_a_message_signed_with_a_bucket_certificate_is_refused_without_a_fetch(
    client, signer, host
):
    """The endpoint refuses it as not from an SNS host (400), before any fetch: the answer is
    not a 503 'unavailable' from trying to fetch it."""
    message = signer.notification(
        ses_bounce("pi@example.net"),
        SigningCertURL=f"https://{host}/SimpleNotificationService-0123.pem",
    )
    response = _post(client, message)
    assert response.status_code == 400, response.content
    assert b"not from an SNS host" in response.content
    assert not DeliveryFeedback.objects.exists()


def test_a_failed_fetch_answers_503_and_is_cached_briefly(client, signer, settings):
    """A certificate host that hangs up: 503 (SNS retries), and the next requests naming the
    same URL within the failure cache cost a look-up, not another fetch."""
    with SilentServer(hang_up=True) as server:
        cert_url = f"{server.url}/SimpleNotificationService-down.pem"
        settings.SES_EVENTS_TRUSTED_CERT_URLS = [cert_url]
        message = signer.notification(ses_bounce("pi@example.net"), SigningCertURL=cert_url)
        answers = [_post(client, message).status_code for _ in range(5)]
        assert answers == [503] * 5
        assert server.connections == 1
    assert not DeliveryFeedback.objects.exists()


def test_forged_signatures_cost_at_most_one_fetch(client, signer, settings):
    """Twenty requests with made-up signatures naming a certificate that cannot be fetched:
    one fetch in all."""
    with SilentServer(hang_up=True) as server:
        cert_url = f"{server.url}/SimpleNotificationService-down.pem"
        settings.SES_EVENTS_TRUSTED_CERT_URLS = [cert_url]
        genuine = signer.notification(ses_bounce("pi@example.net"), SigningCertURL=cert_url)
        for n in range(20):
            forged = {**genuine, "Signature": f"{'A' * 340}{n:02d}=="}
            assert _post(client, forged).status_code in (400, 503)
        assert server.connections <= 1
    assert not DeliveryFeedback.objects.exists()


def test_a_certificate_that_trickles_in_is_abandoned_at_the_total_deadline(
    client, signer, settings
):
    """Each read gets a few bytes in time, so only a total deadline (0.5 s here) stops it."""
    settings.SES_EVENTS_FETCH_DEADLINE_SECONDS = 0.5
    with TrickleServer(signer.pem, chunk=40, interval=0.05) as server:
        cert_url = f"{server.url}/SimpleNotificationService-slow.pem"
        settings.SES_EVENTS_TRUSTED_CERT_URLS = [cert_url]
        message = signer.notification(ses_bounce("pi@example.net"), SigningCertURL=cert_url)
        response = _post(client, message)
        assert response.status_code == 503, response.content
        assert server.bytes_sent < len(signer.pem)
    assert not DeliveryFeedback.objects.exists()


@pytest.mark.skipif(not lockstep_server.available(), reason="reads /proc/net/tcp (Linux)")
def test_a_certificate_larger_than_the_cap_is_refused_after_reading_at_most_the_cap(
    client, signer, settings
):
    """A real certificate followed by 256 KiB of padding (a PEM reader skips text around the
    block, so read whole it would be believed): the fetch stops past MAX_CERT_BYTES and says
    so, having read no more than the cap and one read's chunk (issue 36.4: no test served a
    certificate over 64 KiB). The server sends only as fast as the fetch reads."""
    settings.SES_EVENTS_FETCH_DEADLINE_SECONDS = 30  # the size stops it, not the clock
    padding = b"# padding\n" * (256 * 1024 // 10)
    with LockstepServer(signer.pem + padding, chunk=2048) as server:
        cert_url = f"{server.url}/SimpleNotificationService-large.pem"
        settings.SES_EVENTS_TRUSTED_CERT_URLS = [cert_url]
        message = signer.notification(ses_bounce("pi@example.net"), SigningCertURL=cert_url)
        response = _post(client, message)
        assert response.status_code == 503, response.content
        assert response.content.decode() == (
            f"signing certificate unavailable: answer larger than "
            f"{sns_certificates.MAX_CERT_BYTES} bytes"
        )
        # The refused answer's connection is closed before the endpoint answers, not left to
        # the garbage collector: the host would keep sending into it, and the web worker
        # hold its socket (the response held it open after Connection: close).
        assert not server.client_connected()
    assert sns_certificates.MAX_CERT_BYTES < server.bytes_sent
    assert server.bytes_sent <= sns_certificates.MAX_CERT_BYTES + bounded_fetch._CHUNK
    assert not DeliveryFeedback.objects.exists()


def test_new_certificate_urls_are_fetched_within_a_budget(client, signer, settings):
    """Past SES_EVENTS_CERT_FETCHES_PER_MINUTE fetches of URLs not in the cache, a request
    naming yet another URL answers 503 without a fetch."""
    settings.SES_EVENTS_CERT_FETCHES_PER_MINUTE = 2
    with SilentServer(hang_up=True) as server:
        urls = [f"{server.url}/SimpleNotificationService-{n}.pem" for n in range(4)]
        settings.SES_EVENTS_TRUSTED_CERT_URLS = urls
        for url in urls:
            message = signer.notification(ses_bounce("pi@example.net"), SigningCertURL=url)
            assert _post(client, message).status_code == 503
        assert server.connections == 2


def test_a_certificate_is_fetched_once_then_served_from_the_cache(client, signer):
    for _ in range(3):
        message = signer.notification(ses_bounce("full@example.net", "Transient"))
        assert _post(client, message).status_code == 200
    assert signer.fetches == 1
