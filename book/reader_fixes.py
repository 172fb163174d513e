"""What a reader meets on paper and on a phone: print CSS, phone tables and figures, tooltips, wording.

Adds `book/static/reader.css` and `book/static/reader.js` to every page:

- print (A4): code blocks and printed outputs wrap at the margin instead of being cut, tables and figures fit the page,
  the page's chrome (sidebars, header buttons, footer navigation) is left out;
- phones (below 576 px): a prose table (Markdown's, as in chapter 08) becomes one card per row, each cell under its
  column's name, so every column stays on screen; figures are drawn at least at their print size (a 10-pt label at
  10 CSS px or more; the notebooks' PNGs are 150 dpi) in a box that scrolls sideways; a tap on any figure opens it
  full size in an overlay that scrolls and closes on a tap or Escape (no network);
- touch screens: the theme's tooltips (English on some buttons: "Toggle secondary sidebar") are not shown, since on
  a phone a tap leaves them on screen; the buttons get Chinese titles; a tap on a link in the page's table of
  contents drawer closes the drawer;
- the EOS mark ␃ (U+2403), which no font the README installs has, is drawn as a small boxed "EOS".

The header's download menu says "打印成 PDF" (sphinx-book-theme's zh_CN translation has the Traditional "列印成 PDF").

MyST's `linkify` turns every bare URL of the prose into a link, also the local addresses the course's servers listen
on (http://127.0.0.1:8000/v1), which lead nowhere from a reader's browser: such a link is written as code instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from docutils import nodes

from sphinx.application import Sphinx
from sphinx.config import Config

BOOK_STATIC_DIR = Path(__file__).resolve().parent / "static"
PRINT_TOOLTIP = "打印成 PDF"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1"})


def unlink_local_addresses(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """A bare link to a local address (its text is its URL) becomes inline code: nothing answers there for a reader."""
    for reference in list(doctree.findall(nodes.reference)):
        uri = reference.get("refuri", "")
        try:
            host = urlsplit(uri).hostname
        except ValueError:
            continue
        if host in LOCAL_HOSTS and reference.astext().strip() == uri:
            reference.replace_self(nodes.literal(uri, uri))


def add_static_dir(app: Sphinx, config: Config) -> None:
    if str(BOOK_STATIC_DIR) not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, str(BOOK_STATIC_DIR)]


def simplified_tooltips(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """The header's print button in Simplified wording (sphinx-book-theme adds the buttons at priority 501)."""
    def fix(buttons: list[dict]) -> None:
        for button in buttons:
            if button.get("label") == "download-pdf-button":
                button["tooltip"] = PRINT_TOOLTIP
            fix(button.get("buttons", []))
    fix(context.get("header_buttons", []))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_static_dir)
    app.connect("html-page-context", simplified_tooltips, priority=510)
    app.connect("doctree-resolved", unlink_local_addresses)
    app.add_css_file("reader.css")
    app.add_js_file("reader.js")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
