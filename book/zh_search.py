"""Chinese search that finds multi-word queries.

Sphinx segments the pages with jieba when it builds the index (`html_search_language: zh`), but in the browser it
splits the query only at spaces and punctuation: "温度越低" is looked up as one word and finds nothing. This extension
adds `book/static/zh-search.js` to the search page; the script replaces Sphinx's `splitQuery` with one that cuts each
run of Chinese characters greedily into the longest words that the search index contains.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

BOOK_STATIC_DIR = Path(__file__).resolve().parent / "static"
SCRIPT = "zh-search.js"


def add_static_dir(app: Sphinx, config: Config) -> None:
    if str(BOOK_STATIC_DIR) not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, str(BOOK_STATIC_DIR)]


def add_script_to_search_page(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if pagename == "search":
        app.add_js_file(SCRIPT)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_static_dir)
    app.connect("html-page-context", add_script_to_search_page)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
