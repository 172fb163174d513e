"""Turn the `{doc}` roles of notebooks into plain Markdown links that name the target page, and give each `{numref}`
to a figure the figure's number as its text.

A `{doc}` role to another page reads well in the built book, but jupyterlab-myst 2.7.0 (what `make lab` and
`make lecture` install) cannot see other files: it shows the bare file name, and its link 404s. A plain Markdown link
to the source file works in both: myst-parser resolves `[text](03-strategies.ipynb)` to the page's document link in
the book (checked by `jupyter-book build -W -n`), and JupyterLab opens the notebook when it is clicked. The link's
text is the target's chapter number and title, as the book's table of contents numbers them:

    {doc}`03-strategies`                      ->  [第 3 章 常见解码策略](03-strategies.ipynb)
    {doc}`这一章 <03-strategies>`             ->  [第 3 章 常见解码策略](03-strategies.ipynb)
    {doc}`解码策略：常见解码策略 <03-strategies>`  keeps its text, which names the title

A `{numref}` to a figure drawn by a code cell (`mystnb.figure.name` in its metadata) has the same problem:
jupyterlab-myst cannot see that figure and shows the bare label. (An explicit title does not help: Sphinx needs a
`%s` in it, which jupyterlab-myst shows as it is.) A Markdown link to the figure's label, with the number as its text,
reads in both places; myst-parser resolves `#label` to the figure, and tests/site/test_book.py checks that the text is
the number the figure shows:

    {numref}`fig-overflow`                    ->  [图 1.2](#fig-overflow)
    (in another chapter)                      ->  [图 1.2](01-logits-to-probs.ipynb#fig-overflow)

Figures are numbered as the book numbers them: chapter number, then the figure's place among the chapter's figures;
a link written earlier gets the figure's current number.
Only markdown cells change, so a converted notebook needs no re-execution. Idempotent. `--check` changes nothing and
exits 1 when a notebook would change.

    python scripts/doc_links.py chapters/01-logits-to-probs.ipynb exercises/*.ipynb
    python scripts/doc_links.py --check chapters/*.ipynb
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC_ROLE = re.compile(r"\{doc\}`([^`]+)`")
NUMREF_ROLE = re.compile(r"\{numref\}`([^`]+)`")
FIGURE_LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]*)#([^)\s]+)\)")
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Page:
    """One page of the book: its source file, its chapter number (None for the unnumbered root) and its title."""

    path: Path
    number: int | None
    title: str

    @property
    def link_text(self) -> str:
        return self.title if self.number is None else f"第 {self.number} 章 {self.title}"


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def page_title(path: Path) -> str:
    """The text of the first `# ` heading of a notebook's markdown cells or of a Markdown file."""
    path = Path(path)
    if path.suffix == ".ipynb":
        notebook = json.loads(path.read_text(encoding="utf-8"))
        text = "\n".join(_source(cell) for cell in notebook["cells"] if cell.get("cell_type") == "markdown")
    elif path.suffix == ".md":
        text = path.read_text(encoding="utf-8")
    else:
        raise ValueError(f"path must be a .ipynb or .md file, got {path}")
    heading = _HEADING.search(text)
    if heading is None:
        raise ValueError(f"{path} has no '# ' heading to name it by")
    return heading.group(1)


def book_pages(root: Path = ROOT) -> dict[str, Page]:
    """Every page of `root`'s _toc.yml by its name without extension ('chapters/03-strategies'), numbered as the
    toc numbers them: the root is unnumbered, the chapters of the parts count 1, 2, 3, ... across the parts."""
    import yaml

    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    entries = [(toc["root"], None)]
    chapters = [chapter["file"] for part in toc.get("parts", []) for chapter in part.get("chapters", [])]
    entries += [(name, number) for number, name in enumerate(chapters, start=1)]
    pages = {}
    for name, number in entries:
        files = [Path(root) / f"{name}{suffix}" for suffix in (".ipynb", ".md")]
        existing = [path for path in files if path.is_file()]
        if len(existing) != 1:
            raise ValueError(f"toc entry {name!r} must match exactly one of {[str(f) for f in files]}")
        pages[name] = Page(existing[0], number, page_title(existing[0]))
    return pages


@dataclass(frozen=True)
class Figure:
    """A numbered figure: its number as the book shows it ('图 1.2') and the notebook that draws it."""

    number: str
    path: Path


def figure_numbers(pages: dict[str, Page]) -> dict[str, Figure]:
    """Every code-cell figure of the numbered notebook pages by its name: {'fig-overflow': Figure('图 1.2', ...)}."""
    numbers = {}
    for page in pages.values():
        if page.number is None or page.path.suffix != ".ipynb":
            continue
        notebook = json.loads(page.path.read_text(encoding="utf-8"))
        names = [cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name") for cell in notebook["cells"]]
        for index, name in enumerate([name for name in names if name], start=1):
            if name in numbers:
                raise ValueError(f"figure name {name!r} is used twice ({numbers[name].path.name} and {page.path.name})")
            numbers[name] = Figure(f"图 {page.number}.{index}", page.path.resolve())
    return numbers


def _target_page(target: str, here: Path, pages: dict[str, Page], root: Path) -> Page:
    target = target.strip()
    name = target.lstrip("/") if target.startswith("/") else os.path.relpath(here / target, root)
    name = Path(name).with_suffix("").as_posix() if Path(name).suffix in (".ipynb", ".md") else Path(name).as_posix()
    if name not in pages:
        raise ValueError(f"{{doc}}`{target}` in {here} names no page of the book's toc (known: {sorted(pages)})")
    return pages[name]


def convert_text(text: str, here: Path, pages: dict[str, Page], root: Path = ROOT,
                 figures: dict[str, Figure] | None = None, current: Path | None = None) -> str:
    """`text` (markdown in the file `current`, in the folder `here`) with each `{doc}` role replaced by a Markdown
    link to the page's source file, relative to `here`, whose text is the page's chapter number and title; and each
    `{numref}` to a figure named in `figures` (see figure_numbers), or a link to one, written as a Markdown link to
    the figure's label whose text is the figure's number."""
    here = Path(here).resolve()

    def link(match: re.Match) -> str:
        content = match.group(1)
        explicit = _EXPLICIT.match(content)
        target = explicit.group("target") if explicit else content
        page = _target_page(target, Path(here), pages, root)
        shown = explicit.group("text") if explicit and page.title in explicit.group("text") else page.link_text
        return f"[{shown}]({os.path.relpath(page.path, here)})"

    def figure_link(label: str) -> str | None:
        figure = (figures or {}).get(label.strip())
        if figure is None:
            return None
        same = current is not None and Path(current).resolve() == figure.path
        return f"[{figure.number}]({'' if same else os.path.relpath(figure.path, here)}#{label.strip()})"

    def numbered(match: re.Match) -> str:
        explicit = _EXPLICIT.match(match.group(1))
        # a table, a section, an equation: left to jupyterlab-myst
        return figure_link(explicit.group("target") if explicit else match.group(1)) or match.group()

    def renumbered(match: re.Match) -> str:
        return figure_link(match.group(3)) or match.group()

    return FIGURE_LINK.sub(renumbered, NUMREF_ROLE.sub(numbered, DOC_ROLE.sub(link, text)))


def converted(notebook: dict[str, Any], path: Path, pages: dict[str, Page], root: Path = ROOT,
              figures: dict[str, Figure] | None = None) -> dict[str, Any]:
    """A copy of `notebook` (nbformat 4 JSON as a dict, read from `path`) whose markdown cells hold links instead of
    `{doc}` roles and of `{numref}` roles to figures (convert_text). Code cells and outputs are not touched."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("notebook must be an nbformat 4 notebook dict with a 'cells' list")
    result = copy.deepcopy(notebook)
    for cell in result["cells"]:
        if cell.get("cell_type") != "markdown":
            continue
        before = _source(cell)
        after = convert_text(before, Path(path).resolve().parent, pages, root, figures, path)
        if after != before:
            cell["source"] = after.splitlines(keepends=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's folder, with _toc.yml (default: this repo)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    pages = book_pages(root)
    figures = figure_numbers(pages)
    changed = []
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"not a notebook file: {path}")
        notebook = json.loads(path.read_text(encoding="utf-8"))
        new = converted(notebook, path, pages, root, figures)
        if new != notebook:
            changed.append(path)
            if not args.check:
                path.write_text(json.dumps(new, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for path in changed:
        print(f"{'would convert' if args.check else 'converted'} the {{doc}} and {{numref}} roles of {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
