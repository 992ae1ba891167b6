"""MIME parsing that never raises on what senders put in mail (I7).

The old poller died on `charset=unknown-8bit`: `bytes.decode(charset, errors="replace")`
looks up the codec before `errors=` applies, so an unknown name raised LookupError and the
object was retried forever (COR-19). Here every decode goes through `decode_bytes`, which maps
known aliases, tries the declared charset, then utf-8, cp1252 and latin-1 (which cannot fail).
Header values are decoded from their raw form (8-bit bytes arrive as surrogate escapes) rather
than through the header registry, whose parsers raise on some malformed headers. Every string
that leaves this module is `clean_text`-ed: no NUL, no lone surrogates, so PostgreSQL accepts
it.

Hostile mail (issue 10: parse bombs) is bounded while the stdlib parser builds the message,
not afterwards: the message class the parser instantiates counts MIME parts, nesting depth,
header fields and raw header bytes as they are created and raises `MailLimitExceeded` at the
first limit passed, so no header is RFC 2047-decoded and no part is walked beyond the limits.
The chosen text part is checked against its own limit before it is charset-decoded, and HTML
is converted by lexbor (selectolax), a linear C parser: the stdlib `html.parser` and regexes
are quadratic on tags that are never closed (`"<p" * 40000`: 7 s by regex, 62 s by
`html.parser` on 3.11.7).
The compat32 policy is used on purpose: the header registry of `policy.default` re-parses
Content-Type on every look-up and is slower by an order of magnitude on many-part mail.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import policy
from email.errors import HeaderParseError
from email.header import decode_header
from email.message import Message
from email.parser import BytesParser
from email.utils import getaddresses, parsedate_to_datetime

from email_reply_parser import EmailReplyParser
from selectolax.lexbor import LexborHTMLParser

from inbound_email.conf import get_config
from inbound_email.exceptions import MailLimitExceeded

# Charset names seen in the wild that Python does not know, or knows under another name.
# None means "no information": skip straight to the fallbacks.
CHARSET_ALIASES: dict[str, str | None] = {
    "unknown-8bit": None,
    "x-unknown": None,
    "unknown": None,
    "x-user-defined": None,
    "default": None,
    "ansi_x3.4-1968": "ascii",
    "us-ascii": "ascii",
    "utf8": "utf-8",
    "iso-8859-8-i": "iso-8859-8",
    "iso-8859-6-i": "iso-8859-6",
    "ks_c_5601-1987": "cp949",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "windows-874": "cp874",
    "x-mac-roman": "mac-roman",
    "macintosh": "mac-roman",
}
FALLBACK_CHARSETS = ("utf-8", "cp1252", "latin-1")

MAX_BODY_CHARS = 200_000  # decoded text kept for reply extraction and the admin view
MAX_HEADER_CHARS = 2_000  # one header value

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_HEADER_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]+")
_MSGID_RE = re.compile(r"<([^<>\s]+)>")


# --- limits (issue 10: parse bombs) ----------------------------------------------------------

# Reasons a mail past a limit is quarantined with (values of InboundEmail.Reason).
REASON_MIME_PARTS = "mime_parts_limit"
REASON_MIME_DEPTH = "mime_depth_limit"
REASON_HEADER_COUNT = "header_count_limit"
REASON_HEADER_SIZE = "header_size_limit"
REASON_TEXT_SIZE = "text_size_limit"
LIMIT_REASONS = (
    REASON_MIME_PARTS,
    REASON_MIME_DEPTH,
    REASON_HEADER_COUNT,
    REASON_HEADER_SIZE,
    REASON_TEXT_SIZE,
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


def _header_block(raw: bytes, limits: ParseLimits) -> bytes:
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


def _parser(limits: ParseLimits) -> BytesParser:
    budget = _Budget(limits)

    def factory(policy: policy.Policy = policy.compat32) -> _LimitedMessage:
        return _LimitedMessage(policy, budget=budget)

    return BytesParser(_class=factory, policy=policy.compat32)


def codec_for(charset: str | None) -> str | None:
    """A usable *text* codec name for a declared charset, or None."""
    if not charset:
        return None
    name = charset.strip().strip("\"'").lower()
    if name in CHARSET_ALIASES:
        mapped = CHARSET_ALIASES[name]
        if mapped is None:
            return None
        name = mapped
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError, UnicodeError):
        return None
    # rot13, base64, hex ... are codecs but not text encodings: bytes.decode refuses them.
    return info.name if getattr(info, "_is_text_encoding", True) else None


def decode_bytes(data: bytes, declared: str | None = None) -> str:
    """Decode bytes to str; never raises. Declared charset first, then utf-8, cp1252, latin-1."""
    candidates = []
    declared_codec = codec_for(declared)
    if declared_codec:
        candidates.append(declared_codec)
    candidates.extend(c for c in FALLBACK_CHARSETS if c not in candidates)
    for name in candidates:
        try:
            return data.decode(name)
        except (UnicodeError, LookupError, ValueError, TypeError):
            continue
    return data.decode("latin-1", errors="replace")  # unreachable: latin-1 maps every byte


def clean_text(value: str) -> str:
    """Make a string safe for the database: no NUL or control bytes, no lone surrogates."""
    value = _CONTROL_RE.sub("", value)
    return value.encode("utf-8", errors="replace").decode("utf-8")


def _raw_to_str(value: object) -> str:
    """A raw header value as the parser holds it (8-bit bytes as surrogate escapes) -> str."""
    if isinstance(value, bytes):
        return decode_bytes(value)
    text = str(value)
    try:
        data = text.encode("ascii", errors="surrogateescape")
    except UnicodeEncodeError:
        return text  # already real unicode (not from the byte parser)
    return decode_bytes(data)


def decode_header_value(raw: object) -> str:
    """RFC 2047 decoding of one header value; never raises; single line; bounded length."""
    text = _raw_to_str(raw)
    try:
        parts = decode_header(text)
    except (HeaderParseError, ValueError, LookupError, UnicodeError, TypeError):
        parts = [(text, None)]
    out = []
    for chunk, charset in parts:
        out.append(decode_bytes(chunk, charset) if isinstance(chunk, bytes) else chunk)
    joined = "".join(out)
    joined = _HEADER_CONTROL_RE.sub(" ", joined).strip()
    return clean_text(joined)[:MAX_HEADER_CHARS]


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
    if len(payload) > limits.max_text_bytes:
        raise MailLimitExceeded(
            limit="INBOUND_EMAIL_MAX_TEXT_BYTES",
            reason=REASON_TEXT_SIZE,
            detail=f"the text part decodes to {len(payload)} bytes, more than "
            f"{limits.max_text_bytes}",
        )
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
            return _raw_to_str(value).strip().lower().startswith("attachment")
    return False


# Elements whose end is a line break in the text (what a mail client shows as a new line).
_BLOCK_TAGS = "br,p,div,li,tr,h1,h2,h3,h4,h5,h6,blockquote,pre,table,ul,ol,hr,dt,dd,section,article"


def html_to_text(markup: str) -> str:
    """The text a reader sees in an HTML part, in time linear in its size (lexbor).

    Scripts, styles and the head are dropped; block elements end with a line break so that a
    rating on its own line stays on its own line.
    """
    tree = LexborHTMLParser(markup)
    tree.strip_tags(["script", "style", "head", "title", "template", "noscript"])
    root = tree.body or tree.root
    if root is None:
        return ""
    for node in root.css(_BLOCK_TAGS):
        node.insert_after("\n")
    return root.text(deep=True, separator="", strip=False)


def body_text(message: Message, *, limits: ParseLimits | None = None) -> str:
    """The first text/plain part that is not an attachment, else the first text/html as text."""
    plain = html_part = None
    for part in message.walk():
        if part.is_multipart() or _is_attachment(part):
            continue
        ctype = _content_type(part)
        if ctype == "text/plain" and plain is None:
            plain = part
        elif ctype == "text/html" and html_part is None:
            html_part = part
    limits = limits or ParseLimits.from_settings()
    if plain is not None:
        text = _part_text(plain, limits)
    elif html_part is not None:
        text = html_to_text(_part_text(html_part, limits))
    else:
        text = ""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return clean_text(text)[:MAX_BODY_CHARS]


def extract_reply(text: str) -> str:
    """The new text of a reply: quoted history and signature stripped."""
    reply = EmailReplyParser.parse_reply(text) if text.strip() else ""
    return clean_text(reply).strip()


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
    message = _parser(limits).parsebytes(_header_block(raw, limits), headersonly=True)
    return _from_headers(message)


def parse_mail(raw: bytes, *, limits: ParseLimits | None = None) -> ParsedMail:
    """Parse raw RFC 5322 bytes into a ParsedMail. Never raises on malformed mail; raises
    MailLimitExceeded on mail past a limit (hostile or absurd: quarantined, not retried)."""
    limits = limits or ParseLimits.from_settings()
    _header_block(raw, limits)  # a header block past the limit is refused unparsed
    message = _parser(limits).parsebytes(raw)
    parsed = _from_headers(message)
    parsed.text = body_text(message, limits=limits)
    parsed.reply_text = extract_reply(parsed.text)
    return parsed


def _from_headers(message: Message) -> ParsedMail:
    headers = [
        (clean_text(_HEADER_CONTROL_RE.sub("", _raw_to_str(k)))[:200], decode_header_value(v))
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
