"""Issue 28.4: whatever anyone posts to /ses/events, the answer is a 4xx with a reason (or 503
when a certificate or a SubscribeURL cannot be fetched), never a 500 and never a traceback
in the log. Named shapes first, then Hypothesis: random bytes, random JSON, random SNS
envelopes and, signed with the local test certificate, random SES events."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from notifications.models import DeliveryFeedback
from tests.support.silent_server import SilentServer
from tests.support.sns import TOPIC, ses_bounce

pytestmark = pytest.mark.django_db
URL = "/ses/events"
FUZZ = hypothesis_settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _post_bytes(client, body: bytes):
    # Lower-case utf-8: the test client then posts the bytes as they are.
    return client.post(URL, data=body, content_type="text/plain; charset=utf-8")


def _no_traceback(caplog) -> None:
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


def _envelope(**fields):
    base = {
        "Type": "Notification",
        "MessageId": "5d3c9f1e-0000-4000-8000-000000000000",
        "TopicArn": TOPIC,
        "Message": "{}",
        "Timestamp": "2026-12-04T10:00:00.000Z",
        "SignatureVersion": "1",
        "Signature": "AAAA",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-a.pem",
    }
    return json.dumps({**base, **fields}).encode()


GARBAGE = {
    "deep-arrays": b"[" * 100_000,
    "deep-objects": b'{"a":' * 100_000,
    "deep-valid-json": b"[" * 5_000 + b"]" * 5_000,
    "huge": b'{"Type": "' + b"x" * 3_000_000 + b'"}',
    "huge-number": b'{"Type": ' + b"9" * 10_000 + b"}",
    "latin-1": '{"Type": "Notificación"}'.encode("latin-1"),
    "invalid-utf-8": b'{"Type": "\xff\xfe\xfd"}',
    "lone-surrogate": _envelope(Message="\ud800"),
    "nul": b'{"Type": "\x00"}',
    "empty": b"",
    "not-json": b"hello",
    "array": b"[]",
    "string": b'"Notification"',
    "number": b"1",
    "null": b"null",
    "nan": b'{"Type": NaN}',
    "bad-ipv6-cert-url": _envelope(SigningCertURL="https://[sns.us-east-1.amazonaws.com/x.pem"),
    "bad-port-cert-url": _envelope(
        SigningCertURL="https://sns.us-east-1.amazonaws.com:99999/a.pem"
    ),
    "list-topic": _envelope(TopicArn=[TOPIC]),
    "object-signature": _envelope(Signature={"a": 1}),
    "number-version": _envelope(SignatureVersion=1),
    "unknown-version": _envelope(SignatureVersion="3"),
    "unknown-type": _envelope(Type="Other"),
    "no-type": b'{"TopicArn": "' + TOPIC.encode() + b'"}',
    "signature-not-base64": _envelope(Signature="%%%"),
}


@pytest.mark.parametrize("body", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_answers_400_without_a_traceback(client, signer, caplog, body):
    caplog.set_level(logging.INFO)
    response = _post_bytes(client, body)
    assert response.status_code == 400, response.content[:300]
    _no_traceback(caplog)
    assert not DeliveryFeedback.objects.exists()


SIGNED_GARBAGE = {
    "mail-not-object": {"notificationType": "Bounce", "mail": "x", "bounce": {}},
    "bounce-not-object": {"notificationType": "Bounce", "bounce": ["x"]},
    "recipients-object": {"notificationType": "Bounce", "bounce": {"bouncedRecipients": {"a": 1}}},
    "recipient-string": {"notificationType": "Bounce", "bounce": {"bouncedRecipients": ["a@b.c"]}},
    "complaint-list": {"notificationType": "Complaint", "complaint": []},
    "complaint-recipient-number": {
        "notificationType": "Complaint",
        "complaint": {"complainedRecipients": [7]},
    },
    "address-object": {
        "notificationType": "Bounce",
        "bounce": {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": {"x": 1}}]},
    },
    "long-address": {
        "notificationType": "Bounce",
        "bounce": {"bouncedRecipients": [{"emailAddress": "a" * 5000 + "@example.org"}]},
    },
    "type-object": {"notificationType": {"Bounce": 1}},
    "lone-surrogate": {
        "notificationType": "Bounce",
        "bounce": {"bouncedRecipients": [{"emailAddress": "pi\udc00@example.org"}]},
    },
    "nul": {
        "notificationType": "Bounce",
        "bounce": {"bouncedRecipients": [{"emailAddress": "pi@example.org", "status": "\x00"}]},
    },
}


@pytest.mark.parametrize("event", SIGNED_GARBAGE.values(), ids=SIGNED_GARBAGE.keys())
def test_a_signed_message_with_a_malformed_ses_event_answers_400(client, signer, caplog, event):
    """SNS signs whatever was published to the topic: the event inside is checked too."""
    caplog.set_level(logging.INFO)
    response = _post_bytes(client, json.dumps(signer.notification(event)).encode())
    assert response.status_code == 400, response.content[:300]
    _no_traceback(caplog)
    assert not DeliveryFeedback.objects.exists()


def test_a_subscribe_url_that_cannot_be_fetched_answers_503(client, signer, settings, caplog):
    """SNS sends the confirmation again later: a failed fetch is 503 and says so, no 500."""
    caplog.set_level(logging.INFO)
    with SilentServer(hang_up=True) as server:
        subscribe_url = f"{server.url}/?Action=ConfirmSubscription&Token=abc"
        settings.SES_EVENTS_TRUSTED_SUBSCRIBE_URLS = [subscribe_url]
        message = signer.sign(
            {
                "Type": "SubscriptionConfirmation",
                "MessageId": "0b6d1c7e-0000-4000-8000-000000000001",
                "Token": "abc",
                "TopicArn": TOPIC,
                "Message": "You have chosen to subscribe to the topic.",
                "SubscribeURL": subscribe_url,
                "Timestamp": "2026-12-04T10:00:00.000Z",
                "SignatureVersion": "1",
                "SigningCertURL": signer.cert_url,
            }
        )
        response = _post_bytes(client, json.dumps(message).encode())
    assert response.status_code == 503, response.content
    _no_traceback(caplog)


def _check(client, body: bytes) -> None:
    response = _post_bytes(client, body)
    assert response.status_code in (200, 400, 403, 503), (response.status_code, body[:200])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(body=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzz_random_bytes_never_answer_500(client, signer, body):
    _check(client, body)


@FUZZ
@given(value=_json)
def test_fuzz_random_json_never_answers_500(client, signer, value):
    _check(client, json.dumps(value).encode())


_field_names = st.sampled_from(
    [
        "Type",
        "MessageId",
        "TopicArn",
        "Message",
        "Timestamp",
        "SignatureVersion",
        "Signature",
        "SigningCertURL",
        "SubscribeURL",
        "Token",
        "Subject",
    ]
)


@FUZZ
@given(overrides=st.dictionaries(_field_names, _json | st.text(max_size=80), max_size=5))
def test_fuzz_random_sns_envelopes_never_answer_500(client, signer, overrides):
    # The local certificate unless the example replaces it: no example reaches the network.
    _check(client, _envelope(**{"SigningCertURL": signer.cert_url, **overrides}))


_event_keys = st.sampled_from(
    [
        "notificationType",
        "eventType",
        "mail",
        "bounce",
        "complaint",
        "bounceType",
        "bouncedRecipients",
        "complainedRecipients",
        "emailAddress",
        "messageId",
        "complaintFeedbackType",
        "status",
        "diagnosticCode",
    ]
)
_event = st.recursive(
    st.none()
    | st.integers()
    | st.text(max_size=20)
    | st.sampled_from(["Bounce", "Complaint", "Delivery", "Permanent", "Transient", "a@b.example"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_event_keys, children, max_size=4)
    ),
    max_leaves=15,
)


@hypothesis_settings(FUZZ, max_examples=400)
@given(event=_event, version=st.sampled_from(["1", "2"]))
def test_fuzz_signed_random_ses_events_never_answer_500(client, signer, event, version):
    """Valid signatures over random SES events: the checks past the signature hold too."""
    _check(client, json.dumps(signer.notification(event, version=version)).encode())


def test_a_well_formed_signed_bounce_still_counts(client, signer):
    """The checks above refuse garbage only."""
    response = _post_bytes(
        client, json.dumps(signer.notification(ses_bounce("gone@example.net"))).encode()
    )
    assert response.status_code == 200, response.content
    assert DeliveryFeedback.objects.get().address == "gone@example.net"


def test_message_attributes_are_the_one_field_that_may_be_an_object(client, signer):
    """SNS adds MessageAttributes (unsigned) when the publisher set some: not garbage."""
    message = signer.notification(ses_bounce("gone@example.net"))
    message["MessageAttributes"] = {"source": {"Type": "String", "Value": "ses"}}
    response = _post_bytes(client, json.dumps(message).encode())
    assert response.status_code == 200, response.content
