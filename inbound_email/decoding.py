"""Charset and header decoding that never raises on what senders put in mail (I7).

The old poller died on `charset=unknown-8bit`: `bytes.decode(charset, errors="replace")`
looks up the codec before `errors=` applies, so an unknown name raised LookupError and the
object was retried forever (COR-19). Here every decode goes through `decode_bytes`, which maps
known aliases, tries the declared charset, then utf-8, cp1252 and latin-1 (which cannot fail).
Header values are decoded from their raw form (8-bit bytes arrive as surrogate escapes) rather
than through the header registry, whose parsers raise on some malformed headers. Every string
that leaves this module is `clean_text`-ed: no NUL, no lone surrogates, so PostgreSQL accepts
it.
"""

from __future__ import annotations

import codecs
import re
from email.errors import HeaderParseError
from email.header import decode_header

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

MAX_HEADER_CHARS = 2_000  # one header value

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
HEADER_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]+")


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


def raw_to_str(value: object) -> str:
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
    text = raw_to_str(raw)
    try:
        parts = decode_header(text)
    except (HeaderParseError, ValueError, LookupError, UnicodeError, TypeError):
        parts = [(text, None)]
    out = []
    for chunk, charset in parts:
        out.append(decode_bytes(chunk, charset) if isinstance(chunk, bytes) else chunk)
    joined = "".join(out)
    joined = HEADER_CONTROL_RE.sub(" ", joined).strip()
    return clean_text(joined)[:MAX_HEADER_CHARS]
