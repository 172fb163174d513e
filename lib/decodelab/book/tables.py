"""Tables computed in a notebook, shown as HTML in the book and JupyterLab, and as aligned text everywhere else.

`Table` has both representations: `_repr_html_` for the page (CJK text needs no padding there) and `__repr__` with
columns padded by display width (a CJK character takes two columns), which is also what nbval compares.

    >>> Table(["策略", "loop"], [["greedy", "0.93"], ["纯采样", "0.01"]])
    策略    loop
    ------  ----
    greedy  0.93
    纯采样  0.01

Taught in: chapters/03-strategies.ipynb (and every chapter that shows a computed table)
"""
from __future__ import annotations

import html
import unicodedata
from collections.abc import Sequence


def display_width(text: str) -> int:
    """Columns `text` takes in a monospaced terminal: wide and full-width characters count two."""
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


class Table:
    """A small table of strings: `headers`, `rows` (each as long as `headers`), an optional `caption`."""

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[object]], caption: str | None = None):
        if isinstance(headers, str) or not isinstance(headers, Sequence) or not headers:
            raise ValueError(f"headers must be a non-empty list of str, got {headers!r}")
        self.headers = [str(h) for h in headers]
        self.rows = []
        for i, row in enumerate(rows):
            if isinstance(row, str) or not isinstance(row, Sequence) or len(row) != len(self.headers):
                raise ValueError(f"rows[{i}] must have {len(self.headers)} cells like headers, got {row!r}")
            self.rows.append(["" if cell is None else str(cell) for cell in row])
        if caption is not None and not isinstance(caption, str):
            raise TypeError(f"caption must be a str or None, got {type(caption).__name__}")
        self.caption = caption

    def __repr__(self) -> str:
        widths = [max(display_width(r[c]) for r in [self.headers, *self.rows]) for c in range(len(self.headers))]
        pad = lambda cells: "  ".join(  # noqa: E731
            cell + " " * (w - display_width(cell)) for cell, w in zip(cells, widths)).rstrip()
        lines = ([self.caption] if self.caption else []) + [pad(self.headers), pad(["-" * w for w in widths])]
        return "\n".join(lines + [pad(r) for r in self.rows])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (f'<div class="dl-table-wrap"><table class="dl-table">{caption}<thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table></div>")
