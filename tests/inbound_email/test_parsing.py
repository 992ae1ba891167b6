"""MIME parsing: no charset, header byte or body shape makes it raise; output is DB-safe (I7)."""

from __future__ import annotations

import pytest

from inbound_email.parsing import (
    codec_for,
    decode_bytes,
    extract_reply,
    parse_mail,
    split_reply_text,
)


@pytest.mark.parametrize(
    ("data", "declared", "expected"),
    [
        ("café".encode("latin-1"), "unknown-8bit", "café"),  # COR-19's LookupError
        ("café".encode("cp1252"), "x-no-such-charset", "café"),
        ("café".encode(), None, "café"),
        ("naïve".encode(), "rot13", "naïve"),  # a codec, but not a text encoding
        (b"caf\xe9", "utf\x00-8", "café"),  # NUL in the name: ValueError in codecs.lookup
        ("שלום".encode("iso-8859-8"), "iso-8859-8-i", "שלום"),  # alias
        (b"\x81\x8d\x8f", "utf-8", "\x81\x8d\x8f"),  # neither utf-8 nor cp1252: latin-1
    ],
)
def test_decode_never_raises_and_falls_back(data, declared, expected):
    assert decode_bytes(data, declared) == expected


def test_codec_for_refuses_non_text_codecs():
    assert codec_for("base64") is None and codec_for("hex") is None
    assert codec_for("UTF8") == "utf-8" and codec_for(None) is None


def test_unknown_8bit_mail_decodes_with_fallback():
    raw = (
        b"From: Ada <pi@university.example>\r\nSubject: caf\xe9 \x00ok\r\n"
        b"Content-Type: text/plain; charset=unknown-8bit\r\n\r\nBonjour caf\xe9\x00!\r\n"
    )
    mail = parse_mail(raw)
    assert mail.subject.startswith("café") and "\x00" not in mail.subject  # 8-bit, NUL
    assert mail.text.strip() == "Bonjour café!"
    assert "\x00" not in mail.headers_text()


def test_rfc2047_and_broken_encoded_words():
    mail = parse_mail(
        b"Subject: =?utf-8?q?Caf=C3=A9?= =?bogus-cs?q?x=E9?=\r\nFrom: <pi@u.example>\r\n\r\nhi"
    )
    assert mail.subject.startswith("Café")
    assert parse_mail(b"Subject: =?utf-8?b?!!!?=\r\n\r\nhi").subject is not None


def test_broken_base64_missing_body_and_bad_date():
    raw = (
        b"From: pi@university.example\r\nDate: Mon, 99 Foo 20000 99:99:99 +9999\r\n"
        b"Content-Transfer-Encoding: base64\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        b"!!!not base64===\r\n"
    )
    mail = parse_mail(raw)
    assert mail.date is None
    assert isinstance(mail.text, str)
    empty = parse_mail(b"From: pi@university.example\r\n")
    assert (empty.text, empty.reply_text) == ("", "")
    assert parse_mail(b"").from_address == ""


def test_html_only_mail_is_read_as_text_without_markup():
    raw = (
        b"Content-Type: text/html; charset=utf-8\r\n\r\n"
        b"<p>Please <b>add</b> a timeline</p><script>alert(1)</script><img src='http://x/t.gif'>"
    )
    assert parse_mail(raw).text.strip() == "Please add a timeline"


def test_reply_text_strips_quoted_history_and_signature():
    raw = (
        b"Content-Type: text/plain\r\n\r\n4\r\nMore on methods please.\r\n\r\n"
        b"On Mon, 1 Dec 2026 at 10:00, Assistant <a@x> wrote:\r\n> Please rate\r\n> old\r\n"
    )
    assert parse_mail(raw).reply_text == "4\nMore on methods please."


def test_addresses_in_reply_to_and_multiple_from():
    mail = parse_mail(
        b"From: A <A@X.example>, B <b@y.example>\r\nTo: replies+abc@reply.localhost\r\n"
        b"Cc: other@z.example\r\nIn-Reply-To: <ses-1@email.amazonses.com>\r\n\r\nhi"
    )
    assert (mail.from_address, mail.from_count) == ("a@x.example", 2)
    assert mail.recipients == ["replies+abc@reply.localhost", "other@z.example"]
    assert mail.in_reply_to == ["ses-1@email.amazonses.com"]


# --- nothing the PI wrote is lost silently (issue 10, point 6) -------------------------------

QUOTE_OF_OUR_MAIL = "On Mon, 1 Dec 2026, Assistant wrote:\n> Please rate this proposal\n"


@pytest.mark.parametrize(
    ("body", "reply", "stripped", "cut_lines"),
    [
        pytest.param(
            "4\nPlease tighten the budget.\n\n" + QUOTE_OF_OUR_MAIL,
            "4\nPlease tighten the budget.",
            QUOTE_OF_OUR_MAIL.strip(),
            0,
            id="only-the-quote-of-our-mail",
        ),
        pytest.param(
            "Please ensure\n> 50 participants\nare recruited.\n",
            "Please ensure\nare recruited.",
            "> 50 participants",
            1,
            id="a-line-starting-with-gt",
        ),
        pytest.param(
            "Please add Kim.\n\n__\nAlso cut section 3.\n\n" + QUOTE_OF_OUR_MAIL,
            "Please add Kim.",
            "__\nAlso cut section 3.\n" + QUOTE_OF_OUR_MAIL.strip(),
            2,
            id="text-after-an-underscore-line",
        ),
        pytest.param(
            "Add Kim.\n\n-- \nAda Lovelace\nProfessor\n",
            "Add Kim.",
            "-- \nAda Lovelace\nProfessor",
            3,
            id="signature",
        ),
    ],
)
def test_reply_split_keeps_what_the_parser_strips(body, reply, stripped, cut_lines):
    """Issue 10.6: email-reply-parser drops lines starting with `>` and everything after an
    underscore line; what it drops is kept, and counted unless it is the quote of our mail."""
    split = split_reply_text(body)
    assert (split.reply, split.stripped, split.cut_lines) == (reply, stripped, cut_lines)
    assert split.reply == extract_reply(body)  # the relayed text is unchanged


def test_every_line_of_the_body_is_either_relayed_or_kept():
    body = "Rating: 4\nPlease add Kim.\n> 50 participants\nmore\n__\nlast words\n\n" + (
        QUOTE_OF_OUR_MAIL
    )
    split = parse_mail(
        b"Content-Type: text/plain; charset=utf-8\r\n\r\n" + body.encode()
    ).reply_split
    kept = set(split.reply.splitlines()) | set(split.stripped.splitlines())
    assert {line for line in body.splitlines() if line.strip()} <= kept
