"""Ratings are coerced to an int 1-5 or rejected with a reason (I7); auto-replies (I10)."""

from __future__ import annotations

import pytest

from inbound_email.exceptions import InvalidRating
from inbound_email.parsing import parse_mail
from inbound_email.replies import ReplyContent, auto_reply_reason, coerce_rating, split_reply


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4, 4),
        ("4", 4),
        (" 4/5 ", 4),
        ("Rating: 4 stars", 4),
        ("rating=5", 5),
        ("3 out of 5", 3),
        ("four", 4),
        ("5!", 5),
        (2.0, 2),
        ("1 star", 1),
    ],
)
def test_rating_is_coerced(value, expected):
    assert coerce_rating(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("excellent", "'excellent' is not a number 1-5"),
        ("7", "rating 7 is outside 1-5"),
        ("0", "rating 0 is outside 1-5"),
        ("4/10", "not on a scale of 5"),
        ("4/" + "5" * 5000, "not on a scale of 5"),  # past int()'s 4,300-digit limit
        ("3.5", "not a whole number"),
        (None, "of type NoneType"),
        (True, "True"),
        ([4], "of type list"),
    ],
)
def test_string_rating_is_rejected_with_reason_not_compared(value, reason):
    """COR-19: `rating < 1` on a str raised TypeError and poisoned the object forever."""
    with pytest.raises(InvalidRating, match=reason.replace("(", r"\(")):
        coerce_rating(value)


def test_split_reply():
    assert split_reply("Rating: 4 stars\nAdd a timeline.") == ReplyContent(4, "", "Add a timeline.")
    assert split_reply("3 things to fix: budget, aims, refs") == ReplyContent(
        None,
        "",
        "3 things to fix: budget, aims, refs",
    )
    content = split_reply("Rating: great\nShorter abstract")
    assert (content.rating, content.instruction) == (None, "Shorter abstract")
    assert "'Rating: great' is not a number 1-5" in content.rating_error
    assert split_reply("") == ReplyContent(None, "", "")


@pytest.mark.parametrize(
    ("headers", "kind"),
    [
        ("Auto-Submitted: auto-replied", "auto_reply"),
        ("Precedence: junk", "auto_reply"),
        ("Precedence: list", "auto_reply"),
        ("X-Autoreply: yes", "auto_reply"),
        ("Subject: Out of Office: back Monday", "auto_reply"),
        ("Return-Path: <>", "bounce"),
        ("Content-Type: multipart/report; report-type=delivery-status", "bounce"),
    ],
)
def test_auto_replies_and_bounces_are_detected(headers, kind):
    mail = parse_mail(f"From: pi@university.example\r\n{headers}\r\n\r\nbody".encode())
    assert auto_reply_reason(mail)[0] == kind


def test_human_reply_is_not_automatic():
    mail = parse_mail(
        b"From: pi@university.example\r\nAuto-Submitted: no\r\nSubject: Re: x\r\n\r\n4"
    )
    assert auto_reply_reason(mail) is None
    bounce = parse_mail(b"From: MAILER-DAEMON@mx.example\r\n\r\nfailed")
    assert auto_reply_reason(bounce)[0] == "bounce"
