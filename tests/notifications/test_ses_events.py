"""Issue 23.2: SES's event notifications through SNS to /ses/events, believed only with a
valid SNS signature from an allowed topic, become bounces and complaints on the suppression
list. Signed here with a local test certificate (tests/support/sns.py)."""

from __future__ import annotations

import json

import pytest

from notifications import sns_certificates
from notifications.models import DeliveryFeedback, Suppression
from tests.support.sns import ses_bounce, ses_complaint

pytestmark = pytest.mark.django_db
URL = "/ses/events"


def _post(client, message):
    return client.post(URL, data=json.dumps(message), content_type="text/plain; charset=UTF-8")


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_signed_bounce_suppresses_the_address(client, signer, version):
    """No login, no CSRF token (SNS has neither); SHA1 and SHA256 signatures."""
    response = _post(client, signer.notification(ses_bounce("gone@example.net"), version=version))
    assert response.status_code == 200, response.content
    assert response.json() == {"handled": "feedback", "recorded": 1}
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.reason) == ("gone@example.net", "hard_bounce")
    assert suppression.source_report.startswith("SNS ")


def test_a_complaint_and_a_transient_bounce(client, signer):
    assert _post(client, signer.notification(ses_complaint("angry@example.net"))).status_code == 200
    assert (
        _post(client, signer.notification(ses_bounce("full@example.net", "Transient"))).status_code
        == 200
    )
    kinds = dict(DeliveryFeedback.objects.values_list("address", "kind"))
    assert kinds == {"angry@example.net": "complaint", "full@example.net": "soft_bounce"}
    assert list(Suppression.objects.values_list("address", flat=True)) == ["angry@example.net"]


def test_a_redelivered_message_is_recorded_once(client, signer):
    message = signer.notification(ses_bounce("full@example.net", "Transient"))
    for _ in range(3):
        assert _post(client, message).status_code == 200
    assert DeliveryFeedback.objects.count() == 1
    assert signer.fetches == 1  # the certificate is fetched once, then cached


def test_forged_or_foreign_messages_are_refused_and_change_nothing(client, signer, settings):
    genuine = signer.notification(ses_bounce("pi@example.net"))
    tampered = {**genuine, "Message": json.dumps(ses_bounce("someone.else@example.net"))}
    assert _post(client, tampered).status_code == 400
    other_topic = signer.notification(
        ses_bounce("pi@example.net"), topic="arn:aws:sns:us-east-1:999999999999:mine"
    )
    assert _post(client, other_topic).status_code == 403
    # A certificate anywhere but on SNS's hosts is never fetched.
    foreign_cert = signer.sign(
        {**genuine, "SigningCertURL": "https://evil.example/SimpleNotificationService-x.pem"}
    )
    assert _post(client, foreign_cert).status_code == 400
    settings.SES_EVENTS_TRUSTED_CERT_URLS = []  # production: only SNS hosts
    assert _post(client, genuine).status_code == 400
    assert not DeliveryFeedback.objects.exists() and not Suppression.objects.exists()


def test_only_sns_hosts_sign(settings):
    settings.SES_EVENTS_TRUSTED_CERT_URLS = []
    assert sns_certificates.signing_cert_url_allowed(
        "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem"
    )
    for url in (
        "http://sns.eu-west-1.amazonaws.com/x.pem",
        "https://sns.eu-west-1.amazonaws.com.evil.example/x.pem",
        "https://evil.example/sns.eu-west-1.amazonaws.com/x.pem",
    ):
        assert not sns_certificates.signing_cert_url_allowed(url), url


def test_the_endpoint_is_off_without_a_topic(client, settings):
    settings.SES_EVENTS_TOPIC_ARNS = []
    assert client.post(URL, data="{}", content_type="text/plain").status_code == 404
