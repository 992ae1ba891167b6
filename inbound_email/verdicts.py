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

`Authentication-Results` carries the same verdicts in free form, with comments that echo
sender-chosen text (the From domain, the envelope sender); it is not read: the X-SES fields
say the same in one word.

Pure: header pairs in, `SesVerdicts` out. The policy (what a verdict means for the mail) is
`services.acceptance.screen_ses_verdicts`.
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
