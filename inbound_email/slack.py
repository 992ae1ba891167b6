"""The Slack edge: post one message with slack-sdk, turn every failure into SlackPostError;
find a message posted earlier by its metadata in the channel's history.

slack-sdk's automatic retries are off: a resent chat.postMessage after a reset connection is
a second message. Whether a failed post may still have arrived is `post_outcome_unknown`'s
call; the caller then looks the message up (`find_message`) instead of posting again.

Text from mail is escaped (&, <, >) so `<!channel>`, `<!here>` or `<@U123>` in a reply is
shown literally and pings nobody; `parse="none"` and `link_names=False` keep Slack from
linking names on its own.
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError

from inbound_email.conf import get_config
from inbound_email.exceptions import CallDeadlinePassed, SlackLookupError, SlackPostError
from inbound_email.slack_basics import slack_enabled

HISTORY_PAGE_SIZE = 200  # messages per conversations.history page (Slack allows up to 999)
RETRY_AFTER_DEFAULT_SECONDS = 1.0  # a 429 with no usable Retry-After
RETRY_AFTER_MAX_SECONDS = 3600.0  # "inf", "1e300": a wait past this is taken as this

# What a call can raise besides SlackApiError. urllib wraps only the sending of the request
# in URLError: reading the answer raises http.client's own errors (an answer cut short is
# IncompleteRead, a garbled status line BadStatusLine), which are not OSError; slack-sdk
# passes them through. Unwrapped, they left a relay claim `posting` with no error recorded.
_CALL_ERRORS = (SlackClientError, OSError, ValueError, HTTPException)


def retry_after_seconds(value: object) -> float:
    """Slack's Retry-After as a finite number of seconds within [0, RETRY_AFTER_MAX_SECONDS].

    The header is input from the network: "inf" or "1e300" used to reach `timedelta` and raise
    OverflowError in the relay. Seconds or an HTTP date are understood; a huge value is capped,
    a negative one is 0, and NaN or garbage is the default.
    """
    text = str(value).strip() if value is not None else ""
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return RETRY_AFTER_DEFAULT_SECONDS
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if math.isnan(seconds):
        return RETRY_AFTER_DEFAULT_SECONDS
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_SECONDS)


def _api_error(exc: SlackApiError) -> tuple[str | None, float | None]:
    """Slack's error code of a refused call, and its Retry-After (seconds) when it was a 429."""
    resp = exc.response
    if resp is None:
        return None, None
    retry_after = None
    if resp.status_code == 429:
        headers = resp.headers or {}
        retry_after = retry_after_seconds(headers.get("Retry-After") or headers.get("retry-after"))
    return resp.get("error"), retry_after


# A call is not started with less time than this left before its deadline (seconds).
MIN_CALL_SECONDS = 0.05


def call_timeout(deadline: float | None) -> float:
    """The timeout of one HTTP call: SLACK_TIMEOUT, but at most half of what is left before
    `deadline` (time.monotonic()), so that connecting and sending the request, each bounded by
    the timeout, are over before it. Raises CallDeadlinePassed when too little is left to
    start a call at all (nothing is sent then)."""
    timeout = get_config().slack_timeout
    if deadline is None:
        return timeout
    left = (deadline - time.monotonic()) / 2
    if left < MIN_CALL_SECONDS:
        raise CallDeadlinePassed("the attempt's claim ran out before the call: not sent")
    return min(timeout, left)


def _client(timeout: float) -> WebClient:
    config = get_config()
    return WebClient(
        token=config.slack_bot_token,
        base_url=config.slack_api_url,
        timeout=timeout,  # per connect / send / read (urllib), not in total
        retry_handlers=[],  # never resend on our behalf: a resent post is a duplicate
    )


def post_message(
    *,
    channel: str,
    text: str,
    metadata: Mapping[str, Any] | None = None,
    deadline: float | None = None,
) -> str:
    """Post `text` (already escaped) to `channel`; return the message ts.

    `metadata` ({"event_type": ..., "event_payload": {...}}) is stored with the message, so
    `find_message` can find it after an ambiguous failure. With a `deadline`
    (time.monotonic()) the request is sent before it or not at all (`call_timeout`).
    """
    if not slack_enabled():
        raise SlackPostError("Slack is off (no SLACK_BOT_TOKEN)")
    if not channel:
        raise SlackPostError("the proposal has no Slack channel")
    try:
        client = _client(call_timeout(deadline))
    except CallDeadlinePassed as exc:
        raise SlackPostError(f"Slack chat.postMessage not sent: {exc}") from None
    try:
        response = client.chat_postMessage(
            channel=channel,
            text=text,
            parse="none",
            link_names=False,
            unfurl_links=False,
            unfurl_media=False,
            metadata=dict(metadata) if metadata else None,
        )
    except SlackApiError as exc:
        error, retry_after = _api_error(exc)
        raise SlackPostError(
            f"Slack chat.postMessage failed: {error or exc}", retry_after=retry_after
        ) from exc
    except _CALL_ERRORS as exc:
        raise SlackPostError(f"Slack chat.postMessage failed: {exc}") from exc
    return str(response.get("ts") or "")


def post_outcome_unknown(exc: SlackPostError) -> bool:
    """Whether a failed post may still have reached the channel (look it up before posting
    again): a 5xx, a timeout, a connection reset or an unreadable answer. Not for an answer
    that says it was refused (ok=false, 429, other 4xx) or a connection never made."""
    cause = exc.__cause__
    if cause is None:
        return False  # refused before any call (Slack off, no channel)
    if isinstance(cause, SlackApiError):
        status = getattr(cause.response, "status_code", 0) or 0
        return status >= 500
    if isinstance(cause, SlackRequestError):
        return False  # the request could not even be built
    reason = cause.reason if isinstance(cause, URLError) else cause
    return not isinstance(reason, ConnectionRefusedError | socket.gaierror)


def find_message(
    *,
    channel: str,
    event_type: str,
    event_payload: Mapping[str, Any],
    oldest: float,
    max_pages: int,
    deadline: float | None = None,
) -> str | None:
    """The ts of a message in `channel` newer than `oldest` (epoch seconds) whose metadata
    has `event_type` and every item of `event_payload`; None when the history since `oldest`
    has none.

    Reads conversations.history with include_all_metadata, bounded by `oldest` and at most
    `max_pages` pages. Raises SlackLookupError when the history could not be read to the end,
    because "not found" must mean "not posted" to the caller. The bot needs the
    channels:history (groups:history for private channels) scope. With a `deadline`
    (time.monotonic()) no page is asked for once too little time is left (a lookup error).
    """
    wanted = {key: str(value) for key, value in event_payload.items()}
    cursor: str | None = None
    for _ in range(max_pages):
        try:
            client = _client(call_timeout(deadline))
        except CallDeadlinePassed as exc:
            raise SlackLookupError(f"Slack conversations.history not read: {exc}") from None
        try:
            response = client.conversations_history(
                channel=channel,
                oldest=f"{max(0.0, oldest):.6f}",
                limit=HISTORY_PAGE_SIZE,
                cursor=cursor,
                include_all_metadata=True,
            )
        except SlackApiError as exc:
            error, retry_after = _api_error(exc)
            raise SlackLookupError(
                f"Slack conversations.history failed: {error or exc}", retry_after=retry_after
            ) from exc
        except _CALL_ERRORS as exc:
            raise SlackLookupError(f"Slack conversations.history failed: {exc}") from exc
        for message in response.get("messages") or []:
            meta = message.get("metadata") or {}
            payload = meta.get("event_payload") or {}
            if meta.get("event_type") == event_type and all(
                str(payload.get(key)) == value for key, value in wanted.items()
            ):
                return str(message.get("ts") or "")
        cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
        if not response.get("has_more") or not cursor:
            return None
    raise SlackLookupError(
        f"Slack conversations.history: more than {max_pages} pages since {oldest:.0f}; "
        "the history was not searched to the end"
    )


def share_files(
    *,
    channel: str,
    thread_ts: str,
    files: list[tuple[str, bytes]],
    comment: str,
    deadline: float | None = None,
) -> list[str]:
    """Share `files` ([(file name, bytes)]) in the thread of `thread_ts` with one message
    (`comment`, already escaped): slack-sdk's files_upload_v2 (files.getUploadURLExternal,
    the upload to the URL it returns, then one files.completeUploadExternal, which is what
    shows them). Returns the file ids. Only the last call shows anything in the channel, so
    after an unknown outcome the thread is looked up (`find_thread_message`) for `comment`.
    """
    if not slack_enabled():
        raise SlackPostError("Slack is off (no SLACK_BOT_TOKEN)")
    try:
        client = _client(call_timeout(deadline))
    except CallDeadlinePassed as exc:
        raise SlackPostError(f"Slack files_upload_v2 not sent: {exc}") from None
    try:
        response = client.files_upload_v2(
            file_uploads=[
                {"content": data, "filename": name, "title": name} for name, data in files
            ],
            channel=channel,
            thread_ts=thread_ts,
            initial_comment=comment,
        )
    except SlackApiError as exc:
        error, retry_after = _api_error(exc)
        raise SlackPostError(
            f"Slack files_upload_v2 failed: {error or exc}", retry_after=retry_after
        ) from exc
    except _CALL_ERRORS as exc:
        raise SlackPostError(f"Slack files_upload_v2 failed: {exc}") from exc
    return [str(f.get("id") or "") for f in response.get("files") or []]


def find_thread_message(
    *, channel: str, thread_ts: str, marker: str, max_pages: int, deadline: float | None = None
) -> str | None:
    """The ts of a bot message with files in the thread of `thread_ts` whose text contains
    `marker`; None when the whole thread has none. Raises SlackLookupError when the thread
    could not be read to the end (conversations.replies; the bot's history scopes)."""
    cursor: str | None = None
    for _ in range(max_pages):
        try:
            client = _client(call_timeout(deadline))
        except CallDeadlinePassed as exc:
            raise SlackLookupError(f"Slack conversations.replies not read: {exc}") from None
        try:
            response = client.conversations_replies(
                channel=channel, ts=thread_ts, limit=HISTORY_PAGE_SIZE, cursor=cursor
            )
        except SlackApiError as exc:
            error, retry_after = _api_error(exc)
            raise SlackLookupError(
                f"Slack conversations.replies failed: {error or exc}", retry_after=retry_after
            ) from exc
        except _CALL_ERRORS as exc:
            raise SlackLookupError(f"Slack conversations.replies failed: {exc}") from exc
        for message in response.get("messages") or []:
            if (
                message.get("files")
                and message.get("bot_id")
                and marker in str(message.get("text") or "")
            ):
                return str(message.get("ts") or "")
        cursor = (response.get("response_metadata") or {}).get("next_cursor") or None
        if not response.get("has_more") or not cursor:
            return None
    raise SlackLookupError(
        f"Slack conversations.replies: more than {max_pages} pages in the thread {thread_ts}"
    )
