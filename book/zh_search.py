"""Chinese search that finds multi-word queries, glossary synonyms, and snippets without TeX.

Sphinx segments the pages with jieba when it builds the index (`html_search_language: zh`), but in the browser it
splits the query only at spaces and punctuation: "温度越低" is looked up as one word and finds nothing. This extension
adds `book/static/zh-search.js` to the search page; the script replaces Sphinx's `splitQuery` with one that cuts each
run of Chinese characters greedily into the longest words that the search index contains, and turns the TeX of
result snippets into plain text.

The chapters write most terms in English ("exposure bias") and the glossary gives their Chinese names (曝光偏差), so
a reader who searches the Chinese name would find only the glossary. After the build this extension reads the
glossary's entries (each entry's terms are synonyms) and, in `searchindex.js`, lists under each one-word name of an
entry (a Chinese name, or a single English word as the index stems it) every page that uses any name of the entry.

Those synonym hits all carry Sphinx's same term score, and ties sort by title as text ("1.", "12.", "2."), so the
chapter that teaches a term came anywhere. The extension also writes `_static/zh-search-rank.js` for the search page:
for each one-word name, its synonyms (all names of the entry, for the snippet) and a bonus per page: the glossary
first, then the page that teaches the entry (the first page in reading order with a name in a section title, else
the page that uses the names most), then the others by how often they use the names. zh-search.js adds the bonus to
Sphinx's score (`Scorer.score`), starts each snippet at the first place a name matched and highlights it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment
from sphinx.search import js_index

BOOK_STATIC_DIR = Path(__file__).resolve().parent / "static"
SCRIPT = "zh-search.js"
RANK_SCRIPT = "zh-search-rank.js"  # written into the build's _static/ after the build
GLOSSARY_BONUS, TEACHER_BONUS, USE_BONUS = 40.0, 30.0, 10.0
HAN_WORD = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]{2,}")
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def add_static_dir(app: Sphinx, config: Config) -> None:
    if str(BOOK_STATIC_DIR) not in config.html_static_path:
        config.html_static_path = [*config.html_static_path, str(BOOK_STATIC_DIR)]


def add_script_to_search_page(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if pagename == "search":
        app.add_js_file(RANK_SCRIPT)
        app.add_js_file(SCRIPT)


def glossary_entries(env: BuildEnvironment) -> list[list[str]]:
    """The names of each glossary entry, as written: e.g. ["exposure bias", "曝光偏差"]."""
    entries = []
    for docname in sorted(env.found_docs):
        for glossary in env.get_doctree(docname).findall(addnodes.glossary):
            for item in glossary.findall(nodes.definition_list_item):
                names = [term.astext().strip() for term in item.findall(nodes.term)]
                entries.append([name for name in names if name])
    return entries


def uses(text: str, name: str) -> bool:
    """Whether `text` (lower-cased) contains the term `name`: a Chinese name anywhere, a Latin one as whole words."""
    if HAN_WORD.search(name):
        return name.lower() in text
    return re.search(rf"(?<![a-z0-9_]){re.escape(name.lower())}(?![a-z0-9_])", text) is not None


def index_key(name: str, stem) -> str | None:
    """The search-index word that a one-word query for `name` looks up, or None for a name of several words."""
    if HAN_WORD.fullmatch(name):
        return name
    if LATIN_WORD.fullmatch(name) and "-" not in name:
        return stem(name).lower()
    return None


def synonym_pages(env: BuildEnvironment, docnames: list[str], stem) -> dict[str, set[str]]:
    """For each one-word name of a glossary entry, the pages that use any name of that entry."""
    texts = {docname: env.get_doctree(docname).astext().lower() for docname in docnames}
    pages: dict[str, set[str]] = {}
    for names in glossary_entries(env):
        users = {docname for docname, text in texts.items() if any(uses(text, name) for name in names)}
        for name in names:
            key = index_key(name, stem)
            if key is not None and users:
                pages.setdefault(key, set()).update(users)
    return pages


def count_uses(text: str, name: str) -> int:
    """How often `text` (lower-cased) uses the term `name` (as `uses` matches it)."""
    if HAN_WORD.search(name):
        return text.count(name.lower())
    return len(re.findall(rf"(?<![a-z0-9_]){re.escape(name.lower())}(?![a-z0-9_])", text))


def section_titles(env: BuildEnvironment, docname: str) -> str:
    doctree = env.get_doctree(docname)
    return "\n".join(title.astext() for title in doctree.findall(nodes.title)).lower()


def rank_data(env: BuildEnvironment, docnames: list[str], stem) -> dict[str, dict]:
    """For each one-word name of a glossary entry: {"names": every name of the entry, "bonus": {docname: bonus}}.

    Reading order is the toc's (env.all_docs sorted by the toc's numbering is not kept; the numbered chapter files
    sort in reading order by name, 00-intro ... 10-next)."""
    order = sorted(docnames)
    texts = {docname: env.get_doctree(docname).astext().lower() for docname in order}
    titles = {docname: section_titles(env, docname) for docname in order}
    glossary_pages = {docname for docname in order
                      if any(True for _ in env.get_doctree(docname).findall(addnodes.glossary))}
    data: dict[str, dict] = {}
    for names in glossary_entries(env):
        counts = {docname: sum(count_uses(texts[docname], name) for name in names) for docname in order}
        pages = [docname for docname in order if docname not in glossary_pages and counts[docname] > 0]
        if not pages:
            continue
        headed = [docname for docname in pages if any(count_uses(titles[docname], name) for name in names)]
        teacher = headed[0] if headed else max(pages, key=lambda docname: (counts[docname], -order.index(docname)))
        most = max(counts[docname] for docname in pages)
        bonus = {docname: round(USE_BONUS * counts[docname] / most, 3) for docname in pages}
        bonus[teacher] = TEACHER_BONUS
        bonus.update({docname: GLOSSARY_BONUS for docname in glossary_pages if counts[docname] > 0})
        for name in names:
            for key in {name.lower(), index_key(name, stem)} - {None}:
                if " " not in key:
                    data.setdefault(key, {"names": names, "bonus": bonus})
    return data


def write_rank_script(app: Sphinx, exception: Exception | None) -> None:
    """Write _static/zh-search-rank.js: `window.DL_SEARCH_RANK`, the data of `rank_data`."""
    indexer = getattr(app.builder, "indexer", None)
    static = Path(app.outdir) / "_static"
    if exception is not None or indexer is None or not static.is_dir():
        return
    docnames = sorted(app.env.found_docs)
    data = rank_data(app.env, docnames, indexer.lang.stem)
    script = ("// Written by book/zh_search.py at build time: per glossary name, its synonyms and a bonus per page.\n"
              f"window.DL_SEARCH_RANK = {json.dumps(data, ensure_ascii=False, sort_keys=True)};\n")
    (static / RANK_SCRIPT).write_text(script, encoding="utf-8")


def add_glossary_synonyms(app: Sphinx, exception: Exception | None) -> None:
    """Rewrite the built searchindex.js so that each one-word glossary name finds the pages of its synonyms."""
    indexer = getattr(app.builder, "indexer", None)
    index_file = Path(app.outdir) / "searchindex.js"
    if exception is not None or indexer is None or not index_file.is_file():
        return
    with open(index_file, encoding="utf-8") as f:
        index = js_index.load(f)
    docnames = index["docnames"]
    for key, pages in synonym_pages(app.env, docnames, indexer.lang.stem).items():
        found = index["terms"].get(key, [])
        numbers = set(found if isinstance(found, list) else [found])
        numbers |= {docnames.index(page) for page in pages}
        index["terms"][key] = sorted(numbers)
    with open(index_file, "w", encoding="utf-8") as f:
        js_index.dump(index, f)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", add_static_dir)
    app.connect("html-page-context", add_script_to_search_page)
    app.connect("build-finished", add_glossary_synonyms)
    app.connect("build-finished", write_rank_script)
    return {"version": "1.1", "parallel_read_safe": True, "parallel_write_safe": True}
