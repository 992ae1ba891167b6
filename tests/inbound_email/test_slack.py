"""The Slack edge against the local Slack Web API server: hostile Retry-After headers.

Retry-After comes from the network: "inf" or "1e300" used to reach `timedelta` in the relay
and raise OverflowError (issue 10). Each is clamped to a finite wait in [0, 3600] s.
"""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from inbound_email.exceptions import SlackLookupError, SlackPostError
from inbound_email.models import Reply
from inbound_email.poller import poll_once
from inbound_email.services import reply_relay
from inbound_email.slack import HISTORY_PAGE_SIZE, find_message, post_message, post_outcome_unknown
from tests.support.mail import build_mail
from tests.support.slack_server import Response, SlackServer

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


# --- metadata and conversations.history (issue 10, point 3) ---------------------------------

INSTRUCTION_META = {"event_type": "pi_instruction", "event_payload": {"reply_id": 7}}


def test_find_message_pages_through_the_history_by_metadata(slack):
    since = time.time() - 1
    ts = post_message(channel="C1", text="the instruction", metadata=INSTRUCTION_META)
    for n in range(450):  # a busy channel after the post: it is on the third page
        post_message(channel="C1", text=f"chatter {n}")

    found = find_message(
        channel="C1",
        event_type="pi_instruction",
        event_payload={"reply_id": 7},
        oldest=since,
        max_pages=5,
    )

    assert found == ts
    history = slack.attempts("conversations.history")
    assert len(history) == 3
    assert all(call.args["include_all_metadata"] in ("1", "true") for call in history)
    assert {call.args["oldest"] for call in history} == {f"{since:.6f}"}
    assert "cursor" not in history[0].args and history[1].args["cursor"]


def test_find_message_ignores_other_replies_older_messages_and_bare_text(slack):
    post_message(channel="C1", text="older", metadata=INSTRUCTION_META)
    time.sleep(0.01)
    since = time.time()
    post_message(
        channel="C1",
        text="reply 8",
        metadata={**INSTRUCTION_META, "event_payload": {"reply_id": 8}},
    )
    post_message(channel="C1", text="same text, no metadata")
    post_message(channel="C2", text="other channel", metadata=INSTRUCTION_META)

    assert (
        find_message(
            channel="C1",
            event_type="pi_instruction",
            event_payload={"reply_id": 7},
            oldest=since,
            max_pages=5,
        )
        is None
    )


@pytest.mark.parametrize(
    ("answer", "retry_after"),
    [
        (SlackServer.error("missing_scope"), None),
        (SlackServer.error("internal_error", status=500), None),
        (rate_limited("1e300"), RETRY_AFTER_MAX_SECONDS),
        (SlackServer.truncated_after_post(), None),
    ],
    ids=["api-error", "5xx", "429", "cut-short"],
)
def test_an_unreadable_history_is_a_lookup_error_never_not_found(slack, answer, retry_after):
    slack.script(answer, method="conversations.history")
    with pytest.raises(SlackLookupError) as error:
        find_message(
            channel="C1",
            event_type="pi_instruction",
            event_payload={"reply_id": 7},
            oldest=0,
            max_pages=5,
        )
    assert error.value.retry_after == retry_after


def test_a_history_longer_than_the_page_budget_is_a_lookup_error(slack):
    for n in range(HISTORY_PAGE_SIZE + 1):
        post_message(channel="C1", text=f"chatter {n}")
    with pytest.raises(SlackLookupError, match="not searched to the end"):
        find_message(
            channel="C1",
            event_type="pi_instruction",
            event_payload={"reply_id": 7},
            oldest=0,
            max_pages=1,
        )


@pytest.mark.parametrize(
    ("answer", "unknown"),
    [
        (SlackServer.slow(2.5), True),
        (SlackServer.error_after_post(500), True),
        (SlackServer.error("internal_error", status=502), True),
        (SlackServer.reset_after_post(), True),
        (SlackServer.truncated_after_post(), True),
        (SlackServer.error("channel_not_found"), False),
        (SlackServer.rate_limited(retry_after=1), False),
    ],
    ids=["timeout", "500", "502", "reset", "cut-short", "refused", "429"],
)
def test_which_failed_posts_may_have_reached_the_channel(slack, settings, answer, unknown):
    # A 1 s timeout makes the slow answer a timeout; every other answer is judged with the
    # default 10 s, so a loaded machine that answers a refusal late does not turn it into a
    # timeout (an unknown outcome) and fail the case it is meant to show.
    settings.SLACK_TIMEOUT = 1 if answer.delay else 10
    slack.script(answer)
    with pytest.raises(SlackPostError) as error:
        post_message(channel="C1", text="x", metadata=INSTRUCTION_META)
    assert post_outcome_unknown(error.value) is unknown
    # slack-sdk never resends on our behalf (its default resends after a reset connection).
    assert len(slack.attempts("chat.postMessage")) == 1


def test_a_connection_never_made_is_not_an_unknown_outcome(settings):
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.SLACK_BOT_TOKEN = "xoxb-test-token"
    settings.SLACK_API_URL = f"http://127.0.0.1:{port}/api/"
    with pytest.raises(SlackPostError) as error:
        post_message(channel="C1", text="x")
    assert post_outcome_unknown(error.value) is False
