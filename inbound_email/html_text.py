"""HTML part -> the text a reader sees, in time linear in the markup's size.

lexbor (selectolax) is a linear C parser: the stdlib `html.parser` and regexes are quadratic
on tags that are never closed (`"<p" * 40000`: 7 s by regex, 62 s by `html.parser` on 3.11.7),
which a hostile mail can send (issue 10).
"""

from __future__ import annotations

from selectolax.lexbor import LexborHTMLParser

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
