"""References in notebooks read the same in the book and in JupyterLab: no `{doc}` role (jupyterlab-myst shows it as
the file name, with a link that 404s), every Markdown link to another page of the book names that page's title, and
every reference to a figure is a Markdown link to its label whose text is the figure's number (jupyterlab-myst cannot
see figures drawn by code cells and showed a `{numref}` as the bare label). scripts/doc_links.py writes them; the book build (-W -n) resolves the links, and
tests/site/test_book.py checks that each reference shows the number its figure shows."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "doc_links.py"
sys.path.insert(0, str(SCRIPT.parent))

from doc_links import (  # noqa: E402
    DOC_ROLE, FIGURE_LINK, NUMREF_ROLE, book_pages, convert_text, converted, figure_numbers, main, page_title,
)

NOTEBOOKS = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("exercises/*.ipynb"),
                    *ROOT.glob("exercises/solutions/*.ipynb")])
LOCAL_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+\.(?:ipynb|md))(#[^)]*)?\)")


@pytest.fixture(scope="module")
def pages():
    return book_pages(ROOT)


@pytest.fixture(scope="module")
def figures(pages):
    return figure_numbers(pages)


def _markdown_texts(path: Path) -> list[str]:
    """The markdown cells' sources and the text/markdown outputs of a notebook: what jupyterlab-myst renders."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    texts = []
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            texts.append("".join(cell["source"]))
        for output in cell.get("outputs", []):
            markdown = output.get("data", {}).get("text/markdown")
            if markdown is not None:
                texts.append("".join(markdown))
    return texts


def test_pages_are_numbered_as_the_toc_numbers_them(pages):
    assert pages["chapters/00-intro"].number is None
    assert pages["chapters/01-logits-to-probs"].link_text == "第 1 章 从 logits 到概率"
    assert pages["chapters/07b-speculative-decoding"].number == 8
    assert pages["chapters/10-next"].number == 14


def test_roles_become_links_that_name_the_title(pages):
    here = ROOT / "chapters"
    text = "见 {doc}`03-strategies`；另见 {doc}`这一章 <08-choosing-parameters>` 和 {doc}`/chapters/00-intro`。"
    assert convert_text(text, here, pages) == (
        "见 [第 3 章 常见解码策略](03-strategies.ipynb)；另见 [第 12 章 解码参数怎么选](08-choosing-parameters.md) "
        "和 [读法定位](00-intro.md)。")
    kept = "{doc}`解码参数怎么选（速查） <08-choosing-parameters>`"
    assert convert_text(kept, here, pages) == "[解码参数怎么选（速查）](08-choosing-parameters.md)"
    assert convert_text("{doc}`../chapters/02-temperature`", ROOT / "exercises", pages) == (
        "[第 2 章 Temperature](../chapters/02-temperature.ipynb)")
    once = convert_text(text, here, pages)
    assert convert_text(once, here, pages) == once


def test_figure_references_become_links_that_show_the_number(pages, figures):
    assert figures["fig-shift-invariance"].number == "图 1.1" and figures["fig-temperature-all-contexts"].number == "图 2.3"
    here, chapter_01 = ROOT / "chapters", ROOT / "chapters" / "01-logits-to-probs.ipynb"
    text = ("（{numref}`fig-overflow`）与 {numref}`图 %s <fig-overflow>`，[图 9.9](#fig-overflow)，"
            "表 {numref}`tab-not-a-figure`，[式](#eq-softmax)")
    once = convert_text(text, here, pages, figures=figures, current=chapter_01)
    assert once == ("（[图 1.2](#fig-overflow)）与 [图 1.2](#fig-overflow)，[图 1.2](#fig-overflow)，"
                    "表 {numref}`tab-not-a-figure`，[式](#eq-softmax)")
    assert convert_text(once, here, pages, figures=figures, current=chapter_01) == once
    elsewhere = convert_text("{numref}`fig-overflow`", ROOT / "exercises", pages, figures=figures)
    assert elsewhere == "[图 1.2](../chapters/01-logits-to-probs.ipynb#fig-overflow)"
    assert convert_text(text, here, pages) == text  # no figure table: left alone


def test_an_unknown_target_is_refused(pages):
    with pytest.raises(ValueError, match=r"\{doc\}`99-nothing` in .* names no page of the book's toc"):
        convert_text("{doc}`99-nothing`", ROOT / "chapters", pages)


def test_only_markdown_cells_change(pages):
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["见 {doc}`02-temperature`。\n", "下一行"]},
        {"cell_type": "code", "metadata": {}, "execution_count": 1, "source": "s = '{doc}`02-temperature`'",
         "outputs": []}]}
    result = converted(notebook, ROOT / "chapters" / "x.ipynb", pages)
    assert result["cells"][0]["source"] == ["见 [第 2 章 Temperature](02-temperature.ipynb)。\n", "下一行"]
    assert result["cells"][1] == notebook["cells"][1]
    with pytest.raises(ValueError, match="notebook must be an nbformat 4 notebook dict"):
        converted({"cells": None}, ROOT, pages)


def test_check_mode_changes_nothing_and_reports(tmp_path, capsys):
    """The script on a small book of its own: a root page and two chapters."""
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nparts:\n  - caption: x\n    chapters:\n"
                                       "      - file: a/one\n      - file: a/two\n", encoding="utf-8")
    (tmp_path / "intro.md").write_text("# 导言\n", encoding="utf-8")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "two.md").write_text("# 第二页\n", encoding="utf-8")
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# 第一页\n见 {doc}`two`，回 {doc}`/intro`"}]}
    path = tmp_path / "a" / "one.ipynb"
    path.write_text(json.dumps(notebook), encoding="utf-8")
    assert main(["--check", "--root", str(tmp_path), str(path)]) == 1
    assert "{doc}" in path.read_text(encoding="utf-8")
    assert main(["--root", str(tmp_path), str(path)]) == 0
    assert main(["--check", "--root", str(tmp_path), str(path)]) == 0
    source = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
    assert source == "# 第一页\n见 [第 2 章 第二页](two.md)，回 [导言](../intro.md)"
    assert "would convert" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(ROOT / "README.md")])


def test_page_title_refuses_other_files(tmp_path):
    with pytest.raises(ValueError, match="path must be a .ipynb or .md file"):
        page_title(tmp_path / "x.txt")
    (tmp_path / "empty.md").write_text("no heading\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has no '# ' heading"):
        page_title(tmp_path / "empty.md")


@pytest.mark.parametrize("path", NOTEBOOKS,
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_notebook_links_name_their_pages(path, pages, figures):
    titles = {page.path.resolve(): page.title for page in pages.values()}
    problems = []
    for text in _markdown_texts(path):
        problems += [f"raw role {role.group()}" for role in DOC_ROLE.finditer(text)]
        for role in NUMREF_ROLE.finditer(text):
            if role.group(1).rsplit("<", 1)[-1].rstrip(">").strip() in figures:
                problems.append(f"{role.group()}: a figure reference jupyterlab-myst shows as its label")
        for link in FIGURE_LINK.finditer(text):
            figure = figures.get(link.group(3))
            if figure is not None and link.group(1) != figure.number:
                problems.append(f"{link.group()} does not show the figure's number {figure.number!r}")
        for link in LOCAL_LINK.finditer(text):
            shown, target = link.group(1), (path.parent / link.group(2)).resolve()
            if not target.is_file():
                problems.append(f"{link.group()} points at no file")
            elif target in titles and titles[target] not in shown:
                problems.append(f"{link.group()} does not name its page's title {titles[target]!r}")
    assert not problems, f"{path.relative_to(ROOT)} (fix: python scripts/doc_links.py {path.relative_to(ROOT)}):\n" \
        + "\n".join(problems)
