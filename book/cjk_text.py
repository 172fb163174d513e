"""Chinese prose without stray gaps: line breaks inside a paragraph, and punctuation after inline math.

In Markdown a paragraph may be wrapped over several source lines. The HTML keeps each line break, and a browser shows
it as a space, which is right between English words and wrong between two Chinese characters ("采样。 本章"). This
transform removes, in the prose of every page, each line break (with the spaces around it) that sits between two CJK
characters or next to full-width punctuation, which has its own white space ("。", "（"). A break between a Chinese
character and a Latin letter, a number, inline code or math stays a space, as Chinese typesetting wants there.

MathJax draws inline math as an atomic box, and a browser may break a line right after it, so "除以 $T$。" can put
the "。" at the start of the next line. Inline math followed by closing punctuation (or preceded by opening
punctuation) is wrapped with that punctuation in `<span class="dl-nowrap">`, which book/static/course.css keeps on
one line.

Code blocks, inline code, math and notebook outputs are never changed, except a figure's caption: myst-nb puts the
caption of a figure drawn by a cell (`mystnb.figure.caption`) inside that cell's output, and it is prose.
"""
from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform

# Han ideographs, CJK punctuation, kana, full-width forms: characters between which a line break is no space.
CJK = re.compile("[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
# Full-width punctuation carries its own white space: no space next to it, whatever the other side is.
FULL_WIDTH_PUNCTUATION = re.compile("[\u3000-\u303f\ufe30-\ufe4f\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
# Used in Chinese and in English prose: a break next to one of these goes only when the other side is CJK.
SHARED_PUNCTUATION = frozenset("\u201c\u201d\u2018\u2019\u2014\u2026\u00b7")
LINE_BREAK = re.compile("[ \t]*\n[ \t]*")
CLOSING = "，。、；：？！）》」』〉】〕”’…"
OPENING = "（《「『〈【〔“‘"
NOWRAP_CLASS = "dl-nowrap"

# Blocks whose text is prose, and inline nodes whose text must not change (each is one opaque unit of the line).
PROSE_BLOCKS = (nodes.paragraph, nodes.title, nodes.term, nodes.caption, nodes.rubric, nodes.line,
                nodes.attribution, nodes.field_name)
OPAQUE = (nodes.literal, nodes.math, nodes.math_block, nodes.FixedTextElement, nodes.raw, nodes.comment,
          nodes.image, nodes.substitution_reference)
ATOM = "\x00"  # stands for an opaque node in the joined text: a Latin-like neighbour for joins()


def is_cell_output(node: nodes.Node) -> bool:
    return isinstance(node, nodes.Element) and "cell_output" in node.get("classes", [])


def prose_pieces(block: nodes.Element) -> list[nodes.Text | None]:
    """The Text nodes of `block` in reading order, with None where an opaque node (code, math, …) sits."""
    pieces: list[nodes.Text | None] = []

    def walk(node: nodes.Element) -> None:
        for child in node.children:
            if isinstance(child, nodes.Text):
                pieces.append(child)
            elif isinstance(child, OPAQUE) or is_cell_output(child):
                pieces.append(None)
            elif isinstance(child, nodes.Element):
                walk(child)

    walk(block)
    return pieces


def joins(before: str, after: str) -> bool:
    """Whether a line break between the characters `before` and `after` should vanish rather than show as a space."""
    if FULL_WIDTH_PUNCTUATION.match(before) or FULL_WIDTH_PUNCTUATION.match(after):
        return True
    cjk_before, cjk_after = bool(CJK.match(before)), bool(CJK.match(after))
    return (cjk_before and (cjk_after or after in SHARED_PUNCTUATION)) or (cjk_after and before in SHARED_PUNCTUATION)


def joinable_breaks(text: str) -> list[tuple[int, int]]:
    """Spans of `text` (with ATOM for code and math) that are a line break to remove, as (start, end) offsets:
    between two CJK characters, or next to full-width punctuation ("。", "（")."""
    return [(match.start(), match.end()) for match in LINE_BREAK.finditer(text)
            if 0 < match.start() and match.end() < len(text) and joins(text[match.start() - 1], text[match.end()])]


def remove_cjk_line_breaks(block: nodes.Element) -> int:
    """Delete the joinable line breaks of one prose block in place; returns how many went."""
    pieces = prose_pieces(block)
    text = "".join(ATOM if piece is None else piece.astext() for piece in pieces)
    spans = joinable_breaks(text)
    if not spans:
        return 0
    start = 0
    for piece in pieces:
        length = 1 if piece is None else len(piece.astext())
        end = start + length
        if piece is not None:
            cut = [(max(a, start) - start, min(b, end) - start) for a, b in spans if a < end and b > start]
            if cut:
                old = piece.astext()
                kept, position = [], 0
                for a, b in cut:
                    kept.append(old[position:a])
                    position = b
                kept.append(old[position:])
                split_text(piece.parent, piece, "".join(kept))
        start = end
    return len(spans)


def child_index(parent: nodes.Element, child: nodes.Node) -> int:
    """The position of `child` in `parent`, by identity: docutils' own `index` compares Text nodes as strings, so
    it would find the first of two equal ones (two line breaks, say)."""
    return next(i for i, node in enumerate(parent.children) if node is child)


def split_text(parent: nodes.Element, text_node: nodes.Text, keep: str) -> None:
    """Replace `text_node` in `parent` by `keep`, or remove it when `keep` is empty."""
    index = child_index(parent, text_node)
    if keep:
        parent[index] = nodes.Text(keep)
    else:
        del parent[index]


def keep_math_with_punctuation(math: nodes.math) -> bool:
    """Wrap inline `math` in one no-wrap span with the closing punctuation right after it and the opening
    punctuation right before it. Returns whether there was any."""
    parent = math.parent
    index = child_index(parent, math)
    before = parent[index - 1] if index > 0 else None
    after = parent[index + 1] if index + 1 < len(parent) else None
    opening = before.astext()[-1] if isinstance(before, nodes.Text) and before.astext()[-1:] in set(OPENING) else ""
    closing = after.astext()[0] if isinstance(after, nodes.Text) and after.astext()[:1] in set(CLOSING) else ""
    if not (opening or closing):
        return False
    span = nodes.inline(classes=[NOWRAP_CLASS])
    if opening:
        split_text(parent, before, before.astext()[:-1])
        span += nodes.Text(opening)
    index = child_index(parent, math)
    del parent[index]
    span += math
    if closing:
        split_text(parent, after, after.astext()[1:])
        span += nodes.Text(closing)
    parent.insert(index, span)
    return True


def is_prose(node: nodes.Node, opaque: tuple[type, ...]) -> bool:
    """Whether `node` is prose: not inside an `opaque` node nor a notebook output, unless it is (in) a figure's
    caption, which is prose even inside the output of the cell that draws the figure."""
    current = node
    while current is not None:
        if isinstance(current, nodes.caption):
            return True
        if current is not node and (isinstance(current, opaque) or is_cell_output(current)):
            return False
        current = current.parent
    return True


class CJKProse(SphinxTransform):
    """Join the lines of Chinese paragraphs and keep inline math on one line with its punctuation."""

    default_priority = 700  # after the parsers' own transforms; references are still pending

    def apply(self, **kwargs: Any) -> None:
        for block in list(self.document.findall(lambda node: isinstance(node, PROSE_BLOCKS))):
            if is_prose(block, (nodes.FixedTextElement, nodes.raw)):
                remove_cjk_line_breaks(block)
        for math in list(self.document.findall(nodes.math)):
            if is_prose(math, (nodes.FixedTextElement,)):
                keep_math_with_punctuation(math)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_transform(CJKProse)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
