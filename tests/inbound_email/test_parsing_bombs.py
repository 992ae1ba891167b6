"""Parse bombs (issue 10): every hostile mail is handled in bounded work, and a mail past a
parsing limit is quarantined at once with the limit named.

No timed assertion here (speed is shown by bench/inbound.py, one row per bomb): each bomb runs
under a 10 s alarm that only guards against a hang (the old parser took 7 s to minutes per
bomb, or raised RecursionError), and the assertions are about outcomes and limits.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from inbound_email.exceptions import MailLimitExceeded
from inbound_email.models import InboundEmail
from inbound_email.parsing import (
    LIMIT_REASONS,
    ParseLimits,
    html_to_text,
    parse_headers,
    parse_mail,
)
from inbound_email.poller import poll_once
from notifications.reply_address import reply_address_for
from tests.support.mail import PI_ADDRESS
from tests.support.mail_bombs import Bomb, corpus

Status = InboundEmail.Status
Reason = InboundEmail.Reason

HANG_GUARD_SECONDS = 10
REASON_OF_LIMIT = {
    "INBOUND_EMAIL_MAX_MIME_PARTS": Reason.MIME_PARTS_LIMIT,
    "INBOUND_EMAIL_MAX_MIME_DEPTH": Reason.MIME_DEPTH_LIMIT,
    "INBOUND_EMAIL_MAX_HEADERS": Reason.HEADER_COUNT_LIMIT,
    "INBOUND_EMAIL_MAX_HEADER_BYTES": Reason.HEADER_SIZE_LIMIT,
    "INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES": Reason.HEADER_SIZE_LIMIT,
    "INBOUND_EMAIL_MAX_TEXT_BYTES": Reason.TEXT_SIZE_LIMIT,
    "INBOUND_EMAIL_MAX_HTML_DEPTH": Reason.HTML_DEPTH_LIMIT,  # issue 21
}


class Hung(Exception):
    """The hang guard went off: the parser did unbounded work."""


@contextmanager
def hang_guard(seconds: int = HANG_GUARD_SECONDS) -> Iterator[None]:
    def alarm(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


BOMBS = corpus()


def _ids(bomb: Bomb) -> str:
    return bomb.name


@pytest.mark.parametrize("bomb", BOMBS, ids=_ids)
def test_each_bomb_is_parsed_or_refused_at_its_limit(bomb):
    with hang_guard():
        if bomb.limit:
            with pytest.raises(MailLimitExceeded) as caught:
                parse_mail(bomb.raw)
        else:
            mail = parse_mail(bomb.raw)
    if bomb.limit:
        assert caught.value.limit == bomb.setting
        assert str(caught.value).startswith(bomb.setting)
        assert caught.value.reason == REASON_OF_LIMIT[bomb.setting]
    elif bomb.name.startswith("html"):
        assert mail.text.strip() == "Rating: 4"  # the markup that never closes shows nothing
    else:
        assert mail.from_count > 1


@pytest.mark.parametrize("bomb", [b for b in BOMBS if "HEADER" in b.limit], ids=_ids)
def test_header_bombs_are_refused_by_the_header_only_parse_before_any_decoding(bomb):
    """Raw sizes are checked before the parser reads the block (all fields together) or as it
    adds a field (one field): the 2 MB encoded-word Subject that took decode_header 125 s is
    never decoded."""
    with hang_guard():
        with pytest.raises(MailLimitExceeded) as caught:
            parse_headers(bomb.raw)
    assert caught.value.limit == bomb.setting
    assert "'Subject'" in str(caught.value) or "header" in caught.value.detail


def _multipart(parts: int, *, to: str = "") -> bytes:
    head = f"From: {PI_ADDRESS}\r\nTo: {to}\r\n".encode()
    head += b"Content-Type: multipart/mixed; boundary=x\r\n\r\n"
    body = b"".join(b"--x\r\nContent-Type: text/plain\r\n\r\npart\r\n" for _ in range(parts))
    return head + body + b"--x--\r\n"


def _nested(depth: int) -> bytes:
    raw = b"Content-Type: text/plain\r\n\r\n4\r\n"
    for level in reversed(range(depth)):
        raw = b"Content-Type: multipart/mixed; boundary=n%d\r\n\r\n--n%d\r\n%s\r\n--n%d--\r\n" % (
            level,
            level,
            raw,
            level,
        )
    return b"From: pi@university.example\r\n" + raw


def test_the_limits_are_exact_at_the_boundary():
    """One under each limit parses; one over raises with the limit named: the parser stops at
    the first part, level or field past the limit, whatever the size of the rest."""
    limits = ParseLimits(max_parts=5, max_depth=3, max_headers=12, max_header_bytes=300)
    assert parse_mail(_multipart(4), limits=limits).text.strip() == "part"  # 1 + 4 parts
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_MIME_PARTS"):
        parse_mail(_multipart(5), limits=limits)

    assert parse_mail(_nested(3), limits=limits).text.strip() == "4"
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_MIME_DEPTH"):
        parse_mail(_nested(4), limits=limits)

    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(11))
    assert parse_mail(b"From: a@b.example\r\n" + fields + b"\r\nhi").text == "hi"
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_HEADERS"):
        parse_mail(b"From: a@b.example\r\nX-Extra: v\r\n" + fields + b"\r\nhi", limits=limits)

    subject = b"Subject: " + b"s" * 280 + b"\r\n"
    assert parse_headers(subject, limits=limits).subject == "s" * 280
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_HEADER_BYTES"):
        parse_headers(b"Subject: " + b"s" * 300 + b"\r\n", limits=limits)


def test_all_headers_together_have_their_own_limit():
    limits = ParseLimits(max_header_bytes=1000, max_header_total_bytes=5000)
    fields = b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 900) for i in range(6))
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES"):
        parse_headers(fields, limits=limits)


def test_text_limit_is_checked_before_the_text_is_decoded():
    limits = ParseLimits(max_text_bytes=2000)
    raw = b"From: a@b.example\r\nContent-Type: text/plain\r\n\r\n"
    assert len(parse_mail(raw + b"y" * 2000, limits=limits).text) == 2000
    with pytest.raises(MailLimitExceeded, match="INBOUND_EMAIL_MAX_TEXT_BYTES") as caught:
        parse_mail(raw + b"y" * 2001, limits=limits)
    assert "2001 bytes" in str(caught.value)


def test_every_limit_reason_is_a_ledger_reason():
    assert set(LIMIT_REASONS) <= set(Reason.values)
    assert set(REASON_OF_LIMIT.values()) == set(LIMIT_REASONS)


def test_html_is_converted_to_the_text_a_reader_sees():
    text = html_to_text(
        "<html><head><title>t</title><style>p {color: red}</style></head><body>"
        "<p>Rating: 4</p><div>Please <b>shorten</b> the abstract &amp; the budget<br>"
        "Thanks</div><script>alert(1)</script></body></html>"
    )
    assert text.split("\n")[:3] == [
        "Rating: 4",
        "Please shorten the abstract & the budget",
        "Thanks",
    ]
    assert "alert" not in text and "color" not in text


# --- through the poller --------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("bomb", BOMBS, ids=_ids)
def test_poller_quarantines_each_bomb_at_once_with_the_limit_named(
    bomb, folder_store, notification
):
    [bomb] = [
        b
        for b in corpus(to=reply_address_for(notification.token), sender=PI_ADDRESS)
        if b.name == bomb.name
    ]
    folder_store.put("bomb", bomb.raw)

    with hang_guard():
        summary = poll_once()

    row = InboundEmail.objects.get(store_key="bomb")
    if bomb.limit:
        assert (row.status, row.reason) == (Status.QUARANTINED, REASON_OF_LIMIT[bomb.setting])
        assert row.detail.startswith(bomb.setting)
        assert row.attempts == 1  # at once: not retried
        assert row.quarantine_key == "quarantine/bomb"
        assert bytes(row.raw) == bomb.raw  # kept for the admin and a reprocess
        assert row.headers_text  # the raw preview, without the parser
        assert summary.outcomes == {f"quarantined:{REASON_OF_LIMIT[bomb.setting]}": 1}
    elif bomb.name.startswith("html"):
        assert row.status == Status.PROCESSED
        assert row.reply.rating == 4
    else:
        assert (row.status, row.reason) == (Status.REJECTED, Reason.SENDER_MISMATCH)


@pytest.mark.django_db
def test_limits_come_from_the_settings(settings, folder_store, notification):
    settings.INBOUND_EMAIL_MAX_MIME_PARTS = 3
    folder_store.put("parts", _multipart(3, to=reply_address_for(notification.token)))

    poll_once()

    row = InboundEmail.objects.get(store_key="parts")
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.MIME_PARTS_LIMIT)
    assert row.detail == "INBOUND_EMAIL_MAX_MIME_PARTS: more than 3 MIME parts"


# The shipped default (project/settings.py, docs/security.md's table): every other limit test
# sets its own limits, so this one is the only check of the value a deployment runs with.
SHIPPED_MAX_MIME_PARTS = 100


@pytest.mark.django_db
def test_the_shipped_mime_part_limit_quarantines_a_mail_just_over_it(folder_store, notification):
    """With no override of INBOUND_EMAIL_MAX_MIME_PARTS, a mail of exactly the default number
    of parts (the message itself counted) is read; one part more is quarantined at once."""
    to = reply_address_for(notification.token)
    folder_store.put("at-limit", _multipart(SHIPPED_MAX_MIME_PARTS - 1, to=to))
    folder_store.put("over-limit", _multipart(SHIPPED_MAX_MIME_PARTS, to=to))

    poll_once()

    at_limit = InboundEmail.objects.get(store_key="at-limit")
    assert (at_limit.status, at_limit.reason) == (Status.AWAITING_RELAY, ""), at_limit.detail
    assert at_limit.body_text.strip() == "part"  # parsed: its first text part is the reply
    over = InboundEmail.objects.get(store_key="over-limit")
    assert (over.status, over.reason) == (Status.QUARANTINED, Reason.MIME_PARTS_LIMIT)
    assert over.detail == "INBOUND_EMAIL_MAX_MIME_PARTS: more than 100 MIME parts"
    assert over.attempts == 1  # at once: not retried


@pytest.mark.django_db
@pytest.mark.parametrize(
    "bomb", [b for b in BOMBS if b.limit and "HEADER" not in b.limit], ids=_ids
)
def test_mail_without_a_token_is_rejected_on_its_headers_and_its_body_never_parsed(
    bomb, folder_store
):
    """The cheap header-only checks run first: a body bomb with no reply token is rejected
    `no_token` (its body past a limit is never looked at), not quarantined."""
    raw = bomb.raw.replace(b"replies+" + b"0" * 32, b"someone")
    folder_store.put("untokened", raw)

    with hang_guard():
        poll_once()

    row = InboundEmail.objects.get(store_key="untokened")
    assert (row.status, row.reason) == (Status.REJECTED, Reason.NO_TOKEN)
    assert row.body_text == ""  # the body was not parsed
