"""The Slack edge against the local Slack Web API server: hostile Retry-After headers.

Retry-After comes from the network: "inf" or "1e300" used to reach `timedelta` in the relay
and raise OverflowError (issue 10). Each is clamped to a finite wait in [0, 3600] s.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from inbound_email.exceptions import SlackPostError
from inbound_email.models import Reply
from inbound_email.poller import poll_once
from inbound_email.services import reply_relay
from inbound_email.slack import post_message
from tests.support.mail import build_mail
from tests.support.slack_server import Response

RETRY_AFTER_MAX_SECONDS = 3600.0  # the documented cap (docs/inbound_email.md)

HOSTILE_RETRY_AFTER = [
    ("inf", RETRY_AFTER_MAX_SECONDS),
    ("Infinity", RETRY_AFTER_MAX_SECONDS),
    ("1e300", RETRY_AFTER_MAX_SECONDS),
    ("1e400", RETRY_AFTER_MAX_SECONDS),
    ("86400", RETRY_AFTER_MAX_SECONDS),
    ("-5", 0.0),
    ("-inf", 0.0),
    ("nan", 1.0),
    ("soon", 1.0),
    ("", 1.0),
    ("30", 30.0),
    ("2.5", 2.5),
]


def rate_limited(retry_after: str) -> Response:
    return Response(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": retry_after})


@pytest.mark.parametrize(("header", "expected"), HOSTILE_RETRY_AFTER)
def test_retry_after_from_slack_is_clamped_to_a_finite_wait(slack, header, expected):
    slack.script(rate_limited(header))

    with pytest.raises(SlackPostError) as caught:
        post_message(channel="C0PROPOSAL", text="hello")

    assert caught.value.retry_after == expected
    assert [c.status for c in slack.attempts()] == [429]


def test_retry_after_as_an_http_date_is_the_time_left(slack):
    when = datetime.now(UTC) + timedelta(seconds=120)
    slack.script(rate_limited(format_datetime(when, usegmt=True)))

    with pytest.raises(SlackPostError) as caught:
        post_message(channel="C0PROPOSAL", text="hello")

    assert 100 <= caught.value.retry_after <= 121


@pytest.mark.django_db
@pytest.mark.parametrize("header", ["inf", "1e300", "nan", "-1"])
def test_relay_reschedules_within_the_cap_on_a_hostile_retry_after(
    slack, folder_store, notification, header
):
    """The relay attempt records a retry (no OverflowError, no crash of the job) at most
    RETRY_AFTER_MAX_SECONDS away, and the instruction stays pending, nothing lost."""
    folder_store.put("m", build_mail(token=notification.token, body="Please add a timeline."))
    poll_once()
    reply = Reply.objects.get()
    slack.script(rate_limited(header))
    before = timezone.now()

    assert reply_relay(reply_id=reply.pk) == "retry"

    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.PENDING
    assert reply.relay_attempts == 1
    assert "ratelimited" in reply.relay_last_error
    assert before <= reply.relay_next_attempt_at
    assert reply.relay_next_attempt_at <= timezone.now() + timedelta(
        seconds=RETRY_AFTER_MAX_SECONDS
    )
