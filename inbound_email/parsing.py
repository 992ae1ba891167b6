"""Raw mail -> `ParsedMail`: the header fields and the reply text the handler needs.

`parse_headers` reads the header block only (cheap checks before the body is parsed);
`parse_mail` reads the whole mail. Neither raises on malformed mail (I7): every decode goes
through `decoding` (charset fallbacks, database-safe strings). Both are bounded by the parse
limits while the stdlib parser builds the message (`parse_limits`, issue 10) and raise
`MailLimitExceeded` past one; an HTML-only body is converted by `html_text` in linear time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email.message import Message
from email.parser import Parser
from email.utils import getaddresses, parsedate_to_datetime
from functools import cached_property

from email_reply_parser import EmailReplyParser

from inbound_email.attachments import MailAttachment, mail_attachments
from inbound_email.decoding import (
    HEADER_CONTROL_RE,
    clean_text,
    codec_for,
    decode_bytes,
    decode_header_value,
    raw_to_str,
)
from inbound_email.html_text import html_text, html_to_text, quote_as_text
from inbound_email.parse_limits import (
    LIMIT_REASONS,
    ParseLimits,
    check_html_depth,
    check_text_bytes,
    header_block,
    limited_parser,
)

# What callers import from here (services, tests, bench); some of it lives in the modules above.
__all__ = [
    "LIMIT_REASONS",
    "ParseLimits",
    "ParsedMail",
    "codec_for",
    "decode_bytes",
    "html_to_text",
    "parse_headers",
    "parse_mail",
    "raw_preview",
]

MAX_BODY_CHARS = 200_000  # decoded text kept for reply extraction and the admin view
HIDDEN_TEXT_LABEL = "[text hidden in the HTML, never shown to the reader; not relayed:]"

_MSGID_RE = re.compile(r"<([^<>\s]+)>")


def _addresses(values: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for name, addr in getaddresses(values):
        addr = addr.strip().strip("<>").strip()
        if "@" in addr and " " not in addr:
            pairs.append((name.strip(), addr))
    return pairs


def _parse_date(value: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _part_text(part: Message, limits: ParseLimits) -> str:
    """The part's text; MailLimitExceeded before charset decoding when it is over the limit."""
    try:
        payload = part.get_payload(decode=True)
    except (ValueError, TypeError, LookupError, UnicodeError, AssertionError):
        payload = None
    if payload is None:
        raw = part.get_payload()
        if not isinstance(raw, str):
            return ""
        payload = raw.encode("ascii", errors="surrogateescape")
    if not isinstance(payload, bytes):
        return ""
    check_text_bytes(len(payload), limits)
    try:
        charset = part.get_content_charset()
    except (ValueError, TypeError, LookupError, UnicodeError):
        charset = None
    return decode_bytes(payload, charset)


def _content_type(part: Message) -> str:
    try:
        return (part.get_content_type() or "text/plain").lower()
    except (ValueError, TypeError, AttributeError, IndexError):
        return "text/plain"


def _is_attachment(part: Message) -> bool:
    for name, value in part.raw_items():
        if str(name).lower() == "content-disposition":
            return raw_to_str(value).strip().lower().startswith("attachment")
    return False


@dataclass(frozen=True)
class Body:
    """The body of a mail as the reply handler reads it."""

    text: str  # what the admin shows: the text read, quoted history included
    reply_source: str  # what the reply splitter reads (an HTML part: its visible new text)
    quoted: str = ""  # quoted history the client marked in its HTML ("> "-quoted)
    hidden: str = ""  # text hidden in the HTML: never an instruction


def _html_alternative(alternative: Message) -> Message | None:
    """The HTML version in a multipart/alternative (the last, as RFC 2046 orders them by
    preference), also inside a multipart/related (HTML with its inline images)."""
    found = None
    children = alternative.get_payload()
    for child in children if isinstance(children, list) else []:
        if _is_attachment(child):
            continue
        ctype = _content_type(child)
        if ctype == "text/html":
            found = child
        elif ctype == "multipart/related":
            related = child.get_payload()
            found = next(
                (
                    c
                    for c in (related if isinstance(related, list) else [])
                    if _content_type(c) == "text/html" and not _is_attachment(c)
                ),
                found,
            )
    return found


def _body_part(message: Message) -> Message | None:
    """The part a reader sees as the body: the first text part in document order that is
    not an attachment nor inside an attached message; when it is one of the versions of a
    multipart/alternative, that alternative's HTML version (what a client shows)."""
    stack: list[tuple[Message, Message | None]] = [(message, None)]
    while stack:
        part, parent = stack.pop()
        if _is_attachment(part):
            continue
        ctype = _content_type(part)
        if part.is_multipart():
            if part is not message and ctype == "message/rfc822":
                continue  # an attached mail is not the reply's body
            children = part.get_payload()
            if isinstance(children, list):
                stack.extend((child, part) for child in reversed(children))
            continue
        if ctype not in ("text/plain", "text/html"):
            continue
        if parent is not None and _content_type(parent) == "multipart/alternative":
            return _html_alternative(parent) or part
        return part
    return None


def body_parts(message: Message, *, limits: ParseLimits | None = None) -> Body:
    """The body a reader sees (issue 21: only visible text is an instruction).

    The first text part that is not an attachment; when it comes with an HTML version
    (multipart/alternative), the HTML: a client shows that and never its plain-text twin,
    so the twin may say something the PI never saw, and the HTML is where the clients mark
    their quoted history (`html_text`), kept apart by structure instead of by plain-text
    heuristics. An attached mail (message/rfc822) is never the body. Never raises on
    malformed mail.
    """
    body = _body_part(message)
    ctype = _content_type(body) if body is not None else ""
    html_part = body if ctype == "text/html" else None
    plain = body if ctype == "text/plain" else None
    limits = limits or ParseLimits.from_settings()
    if html_part is not None:
        markup = _part_text(html_part, limits)
        check_html_depth(markup, limits)  # a parser's cost grows with the nesting
        parts = html_text(markup)
        visible = _clean(parts.visible)
        quoted = _clean(quote_as_text(parts.quoted))
        text = (visible.rstrip() + "\n\n" + quoted) if quoted else visible
        return Body(text[:MAX_BODY_CHARS], visible, quoted, _clean(parts.hidden))
    text = _clean(_part_text(plain, limits)) if plain is not None else ""
    return Body(text, text)


def _clean(text: str) -> str:
    return clean_text(text.replace("\r\n", "\n").replace("\r", "\n"))[:MAX_BODY_CHARS]


def body_text(message: Message, *, limits: ParseLimits | None = None) -> str:
    """The body as the admin shows it (`body_parts(...).text`)."""
    return body_parts(message, limits=limits).text


@dataclass(frozen=True)
class ReplySplit:
    """A reply body split by email-reply-parser into what is relayed and what is not."""

    reply: str  # the new text: what is relayed
    stripped: str  # everything else: quoted history, signature, text after a separator line
    cut_lines: int  # non-blank stripped lines, not counting the quote of the mail answered


# The quote of the mail answered: "On <date>, <sender> wrote:" then only "> " lines, at the end.
_QUOTE_HEADER_RE = re.compile(r"^On\s.*wrote:\s*$")


def split_reply_text(text: str) -> ReplySplit:
    """Split a reply body; nothing is lost: `reply` + `stripped` hold every non-blank line.

    The parser drops lines starting with ">" and everything after a signature or separator
    line ("--", "__", Outlook's underscores); a PI's own text can be among them. `cut_lines`
    counts what may be such text, so the relay can say that something was not relayed; the
    trailing quote of the mail answered (what every client appends) is not counted.
    """
    if not text.strip():
        return ReplySplit("", "", 0)
    fragments = EmailReplyParser.read(text).fragments
    kept = [f for f in fragments if not (f.hidden or f.quoted)]
    dropped = [f for f in fragments if (f.hidden or f.quoted) and f.content.strip()]
    counted = list(dropped)
    last = next((f for f in reversed(fragments) if f.content.strip()), None)
    if last is not None and last in dropped and _is_quote_of_answered_mail(last.content):
        counted.remove(last)
    return ReplySplit(
        reply=clean_text("\n".join(f.content for f in kept)).strip(),
        stripped=clean_text("\n".join(f.content for f in dropped)).strip(),
        cut_lines=sum(1 for f in counted for line in f.content.splitlines() if line.strip()),
    )


def _is_quote_of_answered_mail(content: str) -> bool:
    first, *rest = content.strip().splitlines()
    return bool(_QUOTE_HEADER_RE.match(first.strip())) and all(
        line.lstrip().startswith(">") or not line.strip() for line in rest
    )


def extract_reply(text: str) -> str:
    """The new text of a reply: quoted history and signature stripped."""
    return split_reply_text(text).reply


def message_ids(value: str) -> list[str]:
    return [m.lower() for m in _MSGID_RE.findall(value)] or (
        [value.strip().strip("<>").lower()] if value.strip() else []
    )


@dataclass
class ParsedMail:
    """What the reply handler needs from one mail, every string database-safe."""

    message_id: str = ""
    subject: str = ""
    from_name: str = ""
    from_address: str = ""
    from_count: int = 0
    recipients: list[str] = field(default_factory=list)  # To, Cc, Delivered-To, X-Original-To
    in_reply_to: list[str] = field(default_factory=list)  # In-Reply-To then References ids
    date: datetime | None = None
    content_type: str = "text/plain"
    headers: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    reply_text: str = ""
    attachments: list[MailAttachment] = field(default_factory=list)  # parse_mail only

    # From an HTML body (issue 21): what the reply splitter reads (None: `text`), the quoted
    # history the client marked, and text hidden from the reader (never an instruction).
    reply_source: str | None = None
    quoted_text: str = ""
    hidden_text: str = ""

    @cached_property
    def reply_split(self) -> ReplySplit:
        """`reply_text` and what was stripped to get it (see split_reply_text). The quoted
        history an HTML client marked, and text hidden in the HTML (labelled), are kept
        with what was stripped; neither is relayed or counted in `cut_lines` (the client
        marked one as the mail answered; the PI never saw the other)."""
        split = split_reply_text(self.text if self.reply_source is None else self.reply_source)
        hidden = (
            f"{HIDDEN_TEXT_LABEL}\n{self.hidden_text.strip()}" if self.hidden_text.strip() else ""
        )
        stripped = "\n\n".join(p for p in (split.stripped, self.quoted_text.strip(), hidden) if p)
        return ReplySplit(split.reply, stripped, split.cut_lines)

    def header(self, name: str) -> str:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return ""

    def headers_text(self) -> str:
        return "\n".join(f"{k}: {v}" for k, v in self.headers)


def raw_preview(raw: bytes) -> tuple[str, str]:
    """Header block and body of raw mail as plain text, without the MIME parser: for showing
    a mail the parser may have failed on. Never raises."""
    data = raw.replace(b"\r\n", b"\n")
    head, _, body = data.partition(b"\n\n")
    return clean_text(decode_bytes(head))[:50_000], clean_text(decode_bytes(body))[:100_000]


def parse_headers(raw: bytes, *, limits: ParseLimits | None = None) -> ParsedMail:
    """The header fields only (`text` and `reply_text` stay empty): enough for the cheap
    checks (token, sender, auto-reply) before the body is parsed. Bounded by the header limits;
    raises MailLimitExceeded past one."""
    limits = limits or ParseLimits.from_settings()
    message = limited_parser(limits).parsebytes(header_block(raw, limits), headersonly=True)
    return _from_headers(message)


def parse_header_text(text: str) -> ParsedMail:
    """The header fields of a header preview (`raw_preview`'s first part, or the intake's
    `headers_text`: at most 50,000 characters), without the intake's limits: what the admin
    shows of a mail the intake refused for a header limit (issue 36.8), read from the same
    text as the headers it shows. Never raises; `text` is bounded by whoever stored it."""
    message = Parser(policy=policy.compat32).parsestr(text.strip("\n") + "\n\n", headersonly=True)
    return _from_headers(message)


def parse_mail(raw: bytes, *, limits: ParseLimits | None = None) -> ParsedMail:
    """Parse raw RFC 5322 bytes into a ParsedMail. Never raises on malformed mail; raises
    MailLimitExceeded on mail past a limit (hostile or absurd: quarantined, not retried)."""
    limits = limits or ParseLimits.from_settings()
    header_block(raw, limits)  # a header block past the limit is refused unparsed
    message = limited_parser(limits).parsebytes(raw)
    parsed = _from_headers(message)
    body = body_parts(message, limits=limits)
    parsed.text = body.text
    if body.reply_source != body.text:
        parsed.reply_source = body.reply_source
    parsed.quoted_text, parsed.hidden_text = body.quoted, body.hidden
    parsed.reply_text = parsed.reply_split.reply
    parsed.attachments = mail_attachments(message, body_max_bytes=MAX_BODY_CHARS)
    return parsed


def _from_headers(message: Message) -> ParsedMail:
    headers = [
        (clean_text(HEADER_CONTROL_RE.sub("", raw_to_str(k)))[:200], decode_header_value(v))
        for k, v in message.raw_items()
    ]
    parsed = ParsedMail(headers=headers)
    parsed.message_id = (message_ids(parsed.header("Message-ID")) or [""])[0][:500]
    parsed.subject = parsed.header("Subject")[:500]
    from_pairs = _addresses([v for k, v in headers if k.lower() == "from"])
    parsed.from_count = len(from_pairs)
    if from_pairs:
        parsed.from_name, parsed.from_address = from_pairs[0]
        parsed.from_name = parsed.from_name[:200]
        parsed.from_address = parsed.from_address.lower()[:254]
    recipient_headers = {"to", "cc", "delivered-to", "x-original-to", "envelope-to"}
    parsed.recipients = [
        addr.lower()[:254]
        for _, addr in _addresses([v for k, v in headers if k.lower() in recipient_headers])
    ]
    parsed.in_reply_to = message_ids(parsed.header("In-Reply-To")) + message_ids(
        parsed.header("References")
    )
    parsed.date = _parse_date(parsed.header("Date"))
    parsed.content_type = _content_type(message)
    return parsed
