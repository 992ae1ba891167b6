"""What one mail may cost the parser (issue 10: parse bombs), enforced while it is parsed.

Hostile mail is bounded while the stdlib parser builds the message, not afterwards: the
message class the parser instantiates (`limited_parser`) counts MIME parts, nesting depth,
header fields and raw header bytes as they are created and raises `MailLimitExceeded` at the
first limit passed, so no header is RFC 2047-decoded and no part is walked beyond the limits.
The chosen text part is checked (`check_text_bytes`) before it is charset-decoded.
The compat32 policy is used on purpose: the header registry of `policy.default` re-parses
Content-Type on every look-up and is slower by an order of magnitude on many-part mail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesParser

from inbound_email.conf import get_config
from inbound_email.decoding import clean_text
from inbound_email.exceptions import MailLimitExceeded

# Reasons a mail past a limit is quarantined with (values of InboundEmail.Reason).
REASON_MIME_PARTS = "mime_parts_limit"
REASON_MIME_DEPTH = "mime_depth_limit"
REASON_HEADER_COUNT = "header_count_limit"
REASON_HEADER_SIZE = "header_size_limit"
REASON_TEXT_SIZE = "text_size_limit"
REASON_HTML_DEPTH = "html_depth_limit"
LIMIT_REASONS = (
    REASON_MIME_PARTS,
    REASON_MIME_DEPTH,
    REASON_HEADER_COUNT,
    REASON_HEADER_SIZE,
    REASON_TEXT_SIZE,
    REASON_HTML_DEPTH,
)


@dataclass(frozen=True)
class ParseLimits:
    """What one mail may cost the parser; defaults in settings (INBOUND_EMAIL_MAX_*)."""

    max_parts: int = 100  # MIME parts, the message itself included
    max_depth: int = 20  # multipart / message/rfc822 nesting below the message
    max_headers: int = 1000  # header fields, all parts together
    max_header_bytes: int = 16 * 1024  # one header field, raw (before RFC 2047 decoding)
    max_header_total_bytes: int = 256 * 1024  # all header fields together, raw
    max_text_bytes: int = 1024 * 1024  # the text part used, transfer-decoded, before charsets
    max_html_depth: int = 1000  # block elements open at once in the HTML part
    max_report_bytes: int = 32 * 1024  # body bytes read of a bounce or complaint report
    max_bounce_scan_bytes: int = 8 * 1024  # of those, what flufl.bounce's heuristics scan

    @classmethod
    def from_settings(cls) -> ParseLimits:
        config = get_config()
        return cls(
            max_parts=config.max_mime_parts,
            max_depth=config.max_mime_depth,
            max_headers=config.max_headers,
            max_header_bytes=config.max_header_bytes,
            max_header_total_bytes=config.max_header_total_bytes,
            max_text_bytes=config.max_text_bytes,
            max_html_depth=config.max_html_depth,
            max_report_bytes=config.max_report_bytes,
            max_bounce_scan_bytes=config.max_bounce_scan_bytes,
        )


class _Budget:
    """What the parser has built so far for one mail; raises at the first limit passed."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits
        self.parts = 1  # the message itself
        self.headers = 0
        self.header_bytes = 0

    def add_header(self, name: str, value: str) -> None:
        limits = self.limits
        self.headers += 1
        if self.headers > limits.max_headers:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_HEADERS",
                reason=REASON_HEADER_COUNT,
                detail=f"more than {limits.max_headers} header fields",
            )
        size = len(name) + len(value)
        if size > limits.max_header_bytes:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_HEADER_BYTES",
                reason=REASON_HEADER_SIZE,
                detail=f"header field {clean_text(name)[:60]!r} is {size} bytes, more than "
                f"{limits.max_header_bytes}",
            )
        self.header_bytes += size
        if self.header_bytes > limits.max_header_total_bytes:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES",
                reason=REASON_HEADER_SIZE,
                detail=f"header fields of more than {limits.max_header_total_bytes} bytes together",
            )

    def add_part(self, depth: int) -> None:
        limits = self.limits
        self.parts += 1
        if self.parts > limits.max_parts:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_MIME_PARTS",
                reason=REASON_MIME_PARTS,
                detail=f"more than {limits.max_parts} MIME parts",
            )
        if depth > limits.max_depth:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_MIME_DEPTH",
                reason=REASON_MIME_DEPTH,
                detail=f"MIME parts nested more than {limits.max_depth} deep",
            )


class _LimitedMessage(Message):
    """The message class the parser builds: every header and sub-part goes through the
    budget as the parser adds it (the feedparser calls `set_raw` per field and `attach` per
    sub-part; test_the_limits_are_exact_at_the_boundary fails if a Python upgrade changes that)."""

    def __init__(self, policy: policy.Policy = policy.compat32, *, budget: _Budget) -> None:
        super().__init__(policy=policy)
        self._budget = budget
        self._depth = 0

    def set_raw(self, name: str, value: str) -> None:
        self._budget.add_header(name, value)
        super().set_raw(name, value)

    def attach(self, payload: Message) -> None:
        if isinstance(payload, _LimitedMessage):
            payload._depth = self._depth + 1
        self._budget.add_part(self._depth + 1)
        super().attach(payload)


_BLANK_LINE_RE = re.compile(rb"\r?\n\r?\n")


def header_block(raw: bytes, limits: ParseLimits) -> bytes:
    """The top-level header block (up to the first empty line), found without the parser; a
    block past INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES is refused before a line of it is parsed."""
    window = limits.max_header_total_bytes + 4
    end = _BLANK_LINE_RE.search(raw, 0, window)
    if end is None:
        if len(raw) > limits.max_header_total_bytes:
            raise MailLimitExceeded(
                limit="INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES",
                reason=REASON_HEADER_SIZE,
                detail=f"no end of the header block in the first "
                f"{limits.max_header_total_bytes} bytes",
            )
        return raw
    return raw[: end.end()]


def report_window(raw: bytes, limits: ParseLimits, *, body_bytes: int | None = None) -> bytes:
    """What of a mail is read as a bounce or complaint report (issue 28.6): its header block
    and the first `body_bytes` (by default `max_report_bytes`) of its body. The bounce
    detectors cost time per line (flufl.bounce: 1.5 MB of blank lines took 43 s) and a mail
    may hold 10 MB, so they are never given more, whatever the mail's size."""
    block = header_block(raw, limits)
    size = limits.max_report_bytes if body_bytes is None else body_bytes
    return raw[: len(block) + min(size, limits.max_report_bytes)]


def check_text_parts(message: Message, limits: ParseLimits) -> None:
    """Refuse a message any text part of which is over the text limit (transfer-decoded),
    before any detector reads it: the bounce path applies the limit of the reply path."""
    for part in message.walk():
        if part.is_multipart() or part.get_content_maintype() != "text":
            continue
        payload = part.get_payload(decode=True)
        check_text_bytes(len(payload) if isinstance(payload, bytes) else 0, limits)


def limited_parser(limits: ParseLimits) -> BytesParser:
    """A compat32 parser whose messages raise MailLimitExceeded at the first limit passed."""
    budget = _Budget(limits)

    def factory(policy: policy.Policy = policy.compat32) -> _LimitedMessage:
        return _LimitedMessage(policy, budget=budget)

    return BytesParser(_class=factory, policy=policy.compat32)


def check_text_bytes(size: int, limits: ParseLimits) -> None:
    """Refuse a text part of `size` transfer-decoded bytes before it is charset-decoded."""
    if size > limits.max_text_bytes:
        raise MailLimitExceeded(
            limit="INBOUND_EMAIL_MAX_TEXT_BYTES",
            reason=REASON_TEXT_SIZE,
            detail=f"the text part decodes to {size} bytes, more than {limits.max_text_bytes}",
        )


# Start tags whose handling in an HTML parser looks through the stack of open elements (a
# `p` "in button scope"): nested, each costs the depth, so 40,000 nested `<div>` took lexbor
# 28 s (200,000, what 1 MiB holds, would take minutes). Closed by their end tag.
_HTML_TAG_RE = re.compile(rb"<(/?)([A-Za-z][A-Za-z0-9]{0,9})[\s/>]")
_HTML_BLOCK_TAGS = frozenset(
    b"div ul ol dl blockquote section article aside header footer nav main fieldset figure "
    b"figcaption details summary dialog menu address center hgroup dir form pre listing "
    b"h1 h2 h3 h4 h5 h6".split()
)


def check_html_depth(markup: str, limits: ParseLimits) -> None:
    """Refuse an HTML part whose block elements nest deeper than `max_html_depth`, before
    it is parsed (issue 21); one linear scan of the start and end tags. Mail clients nest a
    few dozen deep."""
    depth = deepest = 0
    for match in _HTML_TAG_RE.finditer(markup.encode("utf-8", "surrogatepass")):
        if match.group(2).lower() not in _HTML_BLOCK_TAGS:
            continue
        if match.group(1):
            depth = max(depth - 1, 0)
        else:
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limits.max_html_depth:
                    raise MailLimitExceeded(
                        limit="INBOUND_EMAIL_MAX_HTML_DEPTH",
                        reason=REASON_HTML_DEPTH,
                        detail=f"the HTML part nests block elements more than "
                        f"{limits.max_html_depth} deep",
                    )
