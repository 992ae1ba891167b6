"""HTML part -> the text a reader sees, split from the quoted history, in linear time.

lexbor (selectolax) is a linear C parser: the stdlib `html.parser` and regexes are quadratic
on tags that are never closed (`"<p" * 40000`: 7 s by regex, 62 s by `html.parser` on 3.11.7),
which a hostile mail can send (issue 10).

Only visible text is an instruction (issue 21). The tree is walked once, iteratively (no
recursion, whatever the nesting), and each element goes to one of three places:

* **dropped as hidden**: `<head>`, `<script>`, `<style>`, `<template>`, `<noscript>`,
  `<title>`, comments, and any element a reader never sees: the `hidden` attribute, or an
  inline style with `display:none`, `visibility:hidden|collapse`, `font-size:0`,
  `opacity:0` or `mso-hide:all` (Outlook's own "hide"). Its text is returned apart
  (`HtmlText.hidden`), so nothing is dropped silently, but it is never relayed;
* **quoted history**: Gmail's `div.gmail_quote` (its `div.gmail_attr` "On … wrote:" and its
  `blockquote.gmail_quote`; an inline answer typed between them stays visible), Apple
  Mail's (and Thunderbird's) `blockquote type=cite`, and Outlook's reply header:
  `div#divRplyFwdMsg` (Outlook on the web / new Outlook), the element after
  `div#appendonsend`, or the desktop client's "From: … Sent: …" block (a `div` with a top
  border whose text starts with From:/Von:/De: and names Sent:/Gesendet:/Envoyé:). Outlook
  puts the whole original after its header, not inside it, so from that header on,
  everything that follows in the document is history;
* **visible**: everything else; block elements end with a line break so that a rating on
  its own line stays on its own line.

What is not done: styles from `<style>` sheets and classes are not evaluated (only inline
styles), and text coloured like its background is not detected. Both would need a CSS
engine; the quoted-history and inline-hiding rules cover what the three clients write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser, LexborNode

# Elements whose end is a line break in the text (what a mail client shows as a new line).
_BLOCK_TAGS = frozenset(
    "br p div li tr h1 h2 h3 h4 h5 h6 blockquote pre table ul ol hr dt dd section article".split()
)
_NEVER_SHOWN_TAGS = frozenset(
    {"head", "script", "style", "template", "noscript", "title", "-comment", "!doctype"}
)
_HIDDEN_STYLE_RE = re.compile(
    r"(?:^|;)\s*(?:"
    r"display\s*:\s*none"
    r"|visibility\s*:\s*(?:hidden|collapse)"
    r"|font-size\s*:\s*0*\.?0+\s*(?:px|pt|em|rem|%|ex|ch|vw|vh)?"
    r"|opacity\s*:\s*0*\.?0+\s*%?"
    r"|mso-hide\s*:\s*all"
    r")\s*(?:!\s*important\s*)?(?:;|$)",
    re.IGNORECASE,
)
_OUTLOOK_FROM_RE = re.compile(r"^\s*(?:From|Von|De|Da|Van|Från)\s*:", re.IGNORECASE)
_OUTLOOK_SENT_RE = re.compile(
    r"\b(?:Sent|Gesendet|Envoy[ée]|Enviado|Inviato|Verzonden|Skickat)\s*:", re.IGNORECASE
)
_ATTRIBUTION_RE = re.compile(r"^\s*(On|Am|Le|El|Il|Em|Op)\s.*:\s*$")


@dataclass(frozen=True)
class HtmlText:
    visible: str  # the new text a reader sees
    quoted: str  # the quoted history (the mail answered, as the client quoted it)
    hidden: str  # text in elements a reader never sees (never relayed, kept apart)


def _attr(node: LexborNode, name: str) -> str:
    try:
        value = node.attributes.get(name)
    except (AttributeError, UnicodeError, ValueError):
        return ""
    return value or ""


def _has_attr(node: LexborNode, name: str) -> bool:
    try:
        return name in node.attributes
    except (AttributeError, UnicodeError, ValueError):
        return False


def _is_hidden(node: LexborNode) -> bool:
    if node.tag in _NEVER_SHOWN_TAGS or _has_attr(node, "hidden"):
        return True
    style = _attr(node, "style")
    return bool(style) and _HIDDEN_STYLE_RE.search(style) is not None


def _is_quote(node: LexborNode) -> bool:
    """A quote with a clear end. Inside Gmail's `div.gmail_quote`: its attribution
    (`div.gmail_attr`, "On … wrote:") and its `blockquote.gmail_quote`; text the PI typed
    between them (an inline answer) stays visible. Apple Mail's and Thunderbird's
    `blockquote type=cite`."""
    classes = _attr(node, "class").split()
    if node.tag == "blockquote":
        return _attr(node, "type").strip().lower() == "cite" or "gmail_quote" in classes
    return node.tag == "div" and "gmail_attr" in classes


def _starts_outlook_history(node: LexborNode) -> bool:
    """Outlook's reply header: the original follows it, to the end of the document."""
    if node.tag != "div":
        return False
    if _attr(node, "id") == "divRplyFwdMsg":
        return True
    style = _attr(node, "style").replace(" ", "").lower()
    if "border-top:solid" not in style:
        return False
    head = node.text(deep=True, separator="", strip=False)[:600]
    return bool(_OUTLOOK_FROM_RE.match(head)) and bool(_OUTLOOK_SENT_RE.search(head))


def html_text(markup: str) -> HtmlText:
    """Visible text, quoted history and hidden text of an HTML part (see the module doc)."""
    tree = LexborHTMLParser(markup)
    root = tree.body or tree.root
    if root is None:
        return HtmlText("", "", "")
    visible: list[str] = []
    quoted: list[str] = []
    hidden: list[str] = []
    history_from_here = False  # Outlook's header seen: the rest of the document is history
    # (node, output list, leaving): leaving frames add the block element's line break.
    stack: list[tuple[LexborNode, list[str], bool]] = []
    child = root.last_child
    while child is not None:
        stack.append((child, visible, False))
        child = child.prev
    while stack:
        node, out, leaving = stack.pop()
        if leaving:
            out.append("\n")
            continue
        if history_from_here and out is visible:
            out = quoted
        if node.tag == "-text":
            out.append(node.text_content or "")
            continue
        if _is_hidden(node):
            if node.tag not in _NEVER_SHOWN_TAGS and out is visible:  # hidden in a quote: ours
                hidden.append(node.text(deep=True, separator=" ", strip=True))
            continue
        if out is visible:
            if _attr(node, "id") == "appendonsend" or _starts_outlook_history(node):
                history_from_here = True
                out = quoted
            elif _is_quote(node):
                out = quoted
        if node.tag in _BLOCK_TAGS:
            if node.tag != "br" and out and not out[-1].endswith("\n"):
                out.append("\n")  # a block starts on a new line ("4<div>Cut it</div>")
            stack.append((node, out, True))
        child = node.last_child
        while child is not None:
            stack.append((child, out, False))
            child = child.prev
    return HtmlText(
        visible="".join(visible),
        quoted="".join(quoted),
        hidden="\n".join(h for h in hidden if h),
    )


def quote_as_text(quoted: str) -> str:
    """The quoted history as a plain-text client would quote it: "> " before each line, the
    "On … wrote:" attribution first and unquoted (so the reply splitter knows it for the
    quote of the mail answered, as in a plain-text reply)."""
    lines = [line.rstrip() for line in quoted.replace("\r\n", "\n").split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return ""
    head = []
    if _ATTRIBUTION_RE.match(lines[0]):
        head = [lines.pop(0).strip()]
    return "\n".join([*head, *(f"> {line}".rstrip() for line in lines)])


def html_to_text(markup: str) -> str:
    """The text of an HTML part as a reply body: the visible new text, then the quoted
    history quoted with "> " (hidden text is left out; `html_text` returns it apart)."""
    parts = html_text(markup)
    quote = quote_as_text(parts.quoted)
    return parts.visible + ("\n\n" + quote if quote else "")
