"""A corpus of hostile mails (parse bombs), generated, never stored as blobs.

Each bomb is what issue 10 measured (or a sibling of it) at a size that took seconds to
minutes on the old parser. `limit` is the setting a bomb must be quarantined for, or "" for a
bomb that is within every limit and must simply be parsed quickly (the HTML bombs: the
converter itself was quadratic). Used by tests/inbound_email/test_parsing_limits.py and by
bench/inbound.py (one timing row per bomb).
"""

from __future__ import annotations

from dataclasses import dataclass

# A syntactically valid reply token: the header-only checks let the mail through to the body.
DEFAULT_TO = "replies+" + "0" * 32 + "@reply.localhost"


@dataclass(frozen=True)
class Bomb:
    name: str
    raw: bytes
    limit: str  # the setting named in the quarantine detail; "" = within the limits

    @property
    def setting(self) -> str:
        return f"INBOUND_EMAIL_MAX_{self.limit}" if self.limit else ""


def _html_mail(markup: str, head: bytes) -> bytes:
    """A rating the reader sees, then the never-closed markup."""
    html = "<p>Rating: 4</p>" + markup
    return head + b"Content-Type: text/html; charset=utf-8\r\n\r\n" + html.encode()


def _encoded_word_subject(size: int, head: bytes) -> bytes:
    word = b"=?utf-8?q?a?= "
    return head + b"Subject: " + word * (size // len(word)) + b"\r\n\r\nhi\r\n"


def _folded_subject(size: int, head: bytes) -> bytes:
    line = b" =?utf-8?b?w6k=?=\r\n"
    return head + b"Subject: x\r\n" + line * (size // len(line)) + b"\r\nhi\r\n"


def _many_headers(count: int, head: bytes) -> bytes:
    return head + b"".join(b"X-H%d: v\r\n" % i for i in range(count)) + b"\r\nhi\r\n"


def _empty_parts(size: int, head: bytes) -> bytes:
    part = b"--b\r\n\r\n"
    return (
        head
        + b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
        + part * (size // len(part))
        + b"--b--\r\n"
    )


def _deep_nesting(depth: int, head: bytes) -> bytes:
    body = b"".join(
        b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n" % (i, i + 1)
        for i in range(depth)
    )
    return head + b"Content-Type: multipart/mixed; boundary=b0\r\n\r\n" + body


def _deep_rfc822(depth: int, head: bytes) -> bytes:
    return head + b"Content-Type: message/rfc822\r\n\r\n" * depth + b"hi\r\n"


def _huge_text(size: int, head: bytes) -> bytes:
    return head + b"Content-Type: text/plain\r\n\r\n" + (b"x" * 78 + b"\r\n") * (size // 80)


def _many_from(count: int, to: str) -> bytes:
    return b"From: " + b"a@b.example, " * count + b"\r\nTo: " + to.encode() + b"\r\n\r\nhi\r\n"


def corpus(*, to: str = DEFAULT_TO, sender: str = "pi@university.example") -> list[Bomb]:
    """The bombs, each 0.3-3 MB (under the default 10 MiB mail limit), addressed to `to`."""
    h = f"From: {sender}\r\nTo: {to}\r\nMessage-ID: <bomb@university.example>\r\n".encode()
    return [
        Bomb("html_unclosed_p", _html_mail("<p" * 400_000, h), ""),
        Bomb("html_unclosed_script", _html_mail("<script" * 120_000, h), ""),
        Bomb("html_unclosed_comment", _html_mail("<!--" * 200_000, h), ""),
        Bomb("html_unclosed_attribute", _html_mail("<a x='" * 150_000, h), ""),
        Bomb("encoded_word_subject_2mb", _encoded_word_subject(2_000_000, h), "HEADER_TOTAL_BYTES"),
        Bomb("encoded_word_subject_200kb", _encoded_word_subject(200_000, h), "HEADER_BYTES"),
        Bomb("folded_subject_1mb", _folded_subject(1_000_000, h), "HEADER_TOTAL_BYTES"),
        Bomb("folded_subject_100kb", _folded_subject(100_000, h), "HEADER_BYTES"),
        Bomb("many_headers_1mb", _many_headers(100_000, h), "HEADER_TOTAL_BYTES"),
        Bomb("many_small_headers", _many_headers(5_000, h), "HEADERS"),
        Bomb("empty_mime_parts_1mb", _empty_parts(1_000_000, h), "MIME_PARTS"),
        Bomb("deep_multipart", _deep_nesting(5_000, h), "MIME_DEPTH"),
        Bomb("deep_message_rfc822", _deep_rfc822(20_000, h), "MIME_DEPTH"),
        Bomb("huge_text_part", _huge_text(3_000_000, h), "TEXT_BYTES"),
        Bomb("many_from_addresses", _many_from(1_200, to), ""),
        # Issue 21: lexbor costs the depth per nested <div> (40,000 deep took 28 s).
        Bomb("deep_html_divs", _html_mail("<div>" * 200_000, h), "HTML_DEPTH"),
    ]
