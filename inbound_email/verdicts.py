"""SES's verdicts on a received mail, read from its top-level header block.

SES receiving (with scanning on in the receipt rule) writes `X-SES-Spam-Verdict`,
`X-SES-Virus-Verdict`, `X-SES-SPF-Verdict`, `X-SES-DKIM-Verdict` and `X-SES-DMARC-Verdict`
into every mail it stores, each PASS, FAIL, GRAY or PROCESSING_FAILED.

Why the topmost copy, and only it: a sender can put any header in their mail, X-SES-* ones
included. SES *prepends* its fields to the mail it received, so SES's copy of each verdict is
above anything the sender wrote, and the first field of that name in the header block is
SES's. Later copies are the sender's and are ignored, whichever way they point (a forged PASS
cannot authenticate a forgery; a quoted FAIL cannot get a genuine reply rejected). Fields of
attached messages are never read (they are not in the top-level block). This holds only while
SES writes its verdicts: with scanning off, the topmost copy could be the sender's, which is
why the check is a setting (`INBOUND_EMAIL_CHECK_SES_VERDICTS`) meant for an S3 store fed by a
scanning receipt rule. Even then a forged verdict gains the sender nothing: a PASS only leaves
the mail to the usual checks (token, notified sender), where it would be with the check off,
and a FAIL only rejects the sender's own mail.

`Authentication-Results` (RFC 8601) carries the same checks in free form. Only the topmost
field is read, and only when its authserv-id is the receiving host's
(`INBOUND_EMAIL_AUTHSERV_ID`, SES writes `amazonses.com`): the receiver prepends its field,
so a field below it, or one naming another host, was written by someone else (RFC 8601
section 5). Its `dmarc=` result counts next to `X-SES-DMARC-Verdict` (issue 21). Comments,
which echo sender-chosen text (the envelope sender, the HELO name), are removed before the
field is split, so a `;` or `dmarc=fail` inside one is never read. Parsed by hand: `authres`,
the RFC 8601 library, refuses SES's own field (`client-ip=`, `envelope-from=` are not RFC
8601 properties) with a syntax error.

Pure: header pairs in, `SesVerdicts` (and the A-R `dmarc` result) out. The policy (what a
verdict means for the mail) is `services.acceptance.screen_ses_verdicts`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

PASS, FAIL, GRAY, PROCESSING_FAILED = "PASS", "FAIL", "GRAY", "PROCESSING_FAILED"
UNKNOWN = "UNKNOWN"  # the field is there but its value is none of SES's words
ABSENT = ""
VERDICTS = frozenset({PASS, FAIL, GRAY, PROCESSING_FAILED})

HEADER_OF = {
    "spam": "X-SES-Spam-Verdict",
    "virus": "X-SES-Virus-Verdict",
    "spf": "X-SES-SPF-Verdict",
    "dkim": "X-SES-DKIM-Verdict",
    "dmarc": "X-SES-DMARC-Verdict",
}
_FIELD_OF = {header.lower(): name for name, header in HEADER_OF.items()}
_WORD_RE = re.compile(r"[A-Za-z_]+")


@dataclass(frozen=True)
class SesVerdicts:
    """Each verdict as SES wrote it: PASS / FAIL / GRAY / PROCESSING_FAILED, UNKNOWN when the
    field holds anything else, "" when the field is absent."""

    spam: str = ABSENT
    virus: str = ABSENT
    spf: str = ABSENT
    dkim: str = ABSENT
    dmarc: str = ABSENT

    def any_present(self) -> bool:
        return any(getattr(self, f.name) != ABSENT for f in fields(self))

    def describe(self, *names: str) -> str:
        """ "X-SES-SPF-Verdict: FAIL, X-SES-DKIM-Verdict: (absent)" for the operator's detail."""
        return ", ".join(f"{HEADER_OF[n]}: {getattr(self, n) or '(absent)'}" for n in names)


def normalise_verdict(value: str) -> str:
    """SES's word in any case and surrounded by any whitespace, with an optional trailing
    comment ("FAIL (policy)"); anything else, a smuggled second word included, is UNKNOWN."""
    text = value.strip()
    word = _WORD_RE.match(text)
    if word is None:
        return UNKNOWN
    rest = text[word.end() :].strip()
    if rest and not rest.startswith("("):
        return UNKNOWN
    verdict = word.group().upper()
    return verdict if verdict in VERDICTS else UNKNOWN


def read_ses_verdicts(headers: Iterable[tuple[str, str]]) -> SesVerdicts:
    """The topmost copy of each verdict field (names compared case-insensitively, as RFC 5322
    says); later copies are the sender's and are skipped (see the module docstring)."""
    found: dict[str, str] = {}
    for name, value in headers:
        field = _FIELD_OF.get(name.strip().lower())
        if field is not None and field not in found:
            found[field] = normalise_verdict(value)
    return SesVerdicts(**found)


def _strip_comments(value: str) -> str:
    """The field without its RFC 5322 comments (nested parentheses; quoted strings and
    backslash escapes respected); an unclosed comment runs to the end."""
    out: list[str] = []
    depth = 0
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\":
            escaped = True
            if depth == 0:
                out.append(char)
            continue
        if quoted:
            quoted = char != '"'
            out.append(char)
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0:
            quoted = char == '"'
            out.append(char)
    return "".join(out)


def _split_outside_quotes(value: str) -> list[str]:
    parts, current, quoted = [], [], False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


_RESULT_RE = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:/\s*\d+\s*)?=\s*([A-Za-z]+)")


def read_authentication_results_dmarc(
    headers: Iterable[tuple[str, str]], *, authserv_id: str
) -> str:
    """The `dmarc=` result ("fail", "pass", "none", …, lower case) of the topmost
    Authentication-Results field, when that field is the receiving host's (`authserv_id`,
    compared case-insensitively); "" when there is no such field, it names another host, or it
    has no dmarc result. Any `dmarc=fail` among several dmarc results is "fail"."""
    if not authserv_id.strip():
        return ABSENT
    topmost = next(
        (value for name, value in headers if name.strip().lower() == "authentication-results"),
        None,
    )
    if topmost is None:
        return ABSENT
    pieces = _split_outside_quotes(_strip_comments(topmost))
    host = pieces[0].split()
    if not host or host[0].lower() != authserv_id.strip().lower():
        return ABSENT
    results = []
    for piece in pieces[1:]:
        match = _RESULT_RE.match(piece)
        if match and match.group(1).lower() == "dmarc":
            results.append(match.group(2).lower())
    if "fail" in results:
        return "fail"
    return results[0] if results else ABSENT
