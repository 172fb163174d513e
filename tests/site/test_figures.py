"""Every result figure a chapter's prose quotes is held by that chapter's stored outputs or by the data it reads.

A figure is a number with a decimal point or a percent sign (0.213, 89.0%, 49%, −8.66) in a notebook's markdown cell or
in a figure's caption or alt text (cell metadata `mystnb`); those are prose. Its sources are the stored outputs of the
notebook's code cells (stdout, text/plain, text/html, text/markdown) and the chapters/data/*.json files its code reads.
A figure is found when a source holds it at the precision quoted: the same digits, a longer number that rounds to them,
or the other form of a fraction (0.890 ↔ 89.0%); the sign is not compared ("低 0.155" quotes −0.155). Inline code,
code blocks and references to numbered things (表 4.1, 图 5, 式 3.2) are not figures.

The Markdown pages (00-intro.md, 08-choosing-parameters.md, 09-glossary.md, 10-next.md) quote every chapter and read
no data of their own; they are not checked here.
"""
from __future__ import annotations

import bisect
import html
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"

# Figures that no output holds and should not: parameters the text sets or recommends, figures of a cited paper, and
# figures a formula gives that the cell labels as computed. Keyed by notebook stem ("*": every notebook); each value is
# {figure as quoted: why it has no source}.
ALLOWED: dict[str, dict[str, str]] = {
    "*": {"95%": "the confidence level of the intervals (95% 区间), a setting of the method, not a result"},
    "02-temperature": {
        "0.07": "the alt text reads the label the figure draws (ax.text on the summed impossible bar); only the PNG holds it",
    },
    "03-strategies": dict.fromkeys(
        ["73.66%", "28.94%", "0.22%", "0.36%", "1.48", "6.88", "12.38", "13.13", "22.73"],
        "Holtzman et al. (2020), Table 1 (GPT-2 Large), quoted in 和论文比 and 本页结论 with the citation"),
    "07c-serving": {
        "6.8": "75.8 ÷ 11.1, the ratio of two stored normalized latencies; the cell shows the division",
        "1.20": "1,559 ÷ 1,297 tokens/s, the ratio of two stored throughputs; the cell shows the division",
    },
    "07e-best-of-n": {"0.155": "0.8147 − 0.6593, a difference of two stored figures; the cell writes the subtraction"},
}

FIGURE = re.compile(r"[−\-+]?(?<![A-Za-z0-9_.])\d+(?:,\d{3})*(?:\.\d+)?%?")
SOURCE_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?%?")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
DIRECTIVE = re.compile(r"\{[\w:-]+\}")
DATA_FILE = re.compile(r"data/([\w.-]+\.json)")
# A number that names a thing rather than measures it: 表 4.1, 图 5, 式 3.2, 练习 4.2, 第 3.1 节.
NUMBERED = re.compile(r"(?:表|图|式|练习|第|节|Table|Figure|Fig\.|Eq\.|Section)\s*$")
# 3.0 \times 10^{-5} in math: one figure, read as 3.0e-5.
SCIENTIFIC = re.compile(r"(\d+\.\d+)\s*\\times\s*10\^\{?([−\-+]?\d+)\}?")
RANGE_TO_PERCENT = re.compile(r"\s*(?:–|—|-|~|～|到|至)\s*[−\-+]?\d+(?:\.\d+)?%")


@dataclass(frozen=True)
class Unsourced:
    notebook: str
    cell: int
    figure: str

    def __str__(self) -> str:
        return f"{self.notebook} cell {self.cell}: {self.figure}"


def strip_code(markdown: str) -> str:
    """The prose of a markdown cell: code blocks and inline code removed; MyST directives keep their title and body."""
    kept, fences = [], []  # fences: (marker, is_code) of the blocks open around the current line
    for line in markdown.splitlines():
        fence = FENCE.match(line)
        if fence and fences and fence.group(1).startswith(fences[-1][0]) and not fence.group(2).strip():
            fences.pop()  # a bare fence at least as long as the open one closes it
            continue
        if fence and not (fences and fences[-1][1]):
            info = fence.group(2).strip()
            directive = DIRECTIVE.match(info)
            fences.append((fence.group(1), directive is None))
            if directive:
                kept.append(info[directive.end():])  # the directive's title is prose
            continue
        if not (fences and fences[-1][1]):
            kept.append(line)
    return re.sub(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", " ", "\n".join(kept))


def quoted_figures(prose: str) -> list[str]:
    """The figures a piece of prose quotes, as written (a percent sign carried over from the end of a range)."""
    text = strip_code(prose)
    figures = [match.group() for match in SCIENTIFIC.finditer(text)]
    text = SCIENTIFIC.sub(" ", text)
    for match in FIGURE.finditer(text):
        start, figure = match.start(), match.group()
        if not figure.endswith("%") and RANGE_TO_PERCENT.match(text, match.end()):
            figure += "%"  # "5.7–9.7%": the first number of a percent range is a percent too
        if "." not in figure and not figure.endswith("%"):
            continue  # a count, a year, an id
        before = text[:start]
        if before.endswith(("-", "_", ".")) or re.search(r"[A-Za-z]$", before) or NUMBERED.search(before):
            continue  # Llama-3.1, Qwen2.5, v0.6, 表 4.1
        after = text[match.end():match.end() + 2]
        if re.match(r"[A-Za-z_]|\.\d", after) and not figure.endswith("%"):
            continue  # 0.5B, 127.0.0.1: a name, an address or a unit glued to the number
        figures.append(figure)
    return figures


def canonical(token: str) -> tuple[float, int]:
    """A written number as (absolute value, decimals), a percent as its fraction: "89.0%" -> (0.89, 3)."""
    scientific = SCIENTIFIC.fullmatch(token)
    if scientific:
        token = f"{scientific.group(1)}e{scientific.group(2).replace('−', '-')}"
    digits = token.lstrip("−-+").replace(",", "")
    percent = digits.endswith("%")
    digits = digits.rstrip("%")
    mantissa = re.split(r"[eE]", digits)[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if re.search(r"[eE]", digits):
        decimals += -int(re.split(r"[eE]", digits)[1])
    value = abs(float(digits))
    return (value / 100, decimals + 2) if percent else (value, decimals)


class Sources:
    """Numbers from outputs (with the decimals they were printed with) and from data (exact), sorted for lookup."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self.decimals: list[float] = []

    def add_text(self, text: str) -> None:
        for token in SOURCE_NUMBER.findall(text):
            value, decimals = canonical(token)
            self._add(value, decimals)

    def add_data(self, data) -> None:
        if isinstance(data, bool):
            return
        if isinstance(data, (int, float)):
            if math.isfinite(data):
                value = abs(float(data))
                self._add(value, math.inf)
                self._add(value / 100, math.inf)  # a percent stored as 89.0, quoted as 89.0%
        elif isinstance(data, dict):
            for item in data.values():
                self.add_data(item)
        elif isinstance(data, list):
            for item in data:
                self.add_data(item)
        elif isinstance(data, str):
            self.add_text(data)

    def _add(self, value: float, decimals: float) -> None:
        self.values.append(value)
        self.decimals.append(decimals)

    def freeze(self) -> None:
        order = sorted(range(len(self.values)), key=self.values.__getitem__)
        self.values = [self.values[i] for i in order]
        self.decimals = [self.decimals[i] for i in order]

    def holds(self, figure: str) -> bool:
        value, decimals = canonical(figure)
        half_step = 0.5 * 10.0 ** -decimals * (1 + 1e-9) + 1e-12  # the interval that rounds to the quoted digits
        low = bisect.bisect_left(self.values, value - half_step)
        high = bisect.bisect_right(self.values, value + half_step)
        return any(self.decimals[i] >= decimals for i in range(low, high))


def notebook_sources(notebook: nbformat.NotebookNode, data_dir: Path) -> Sources:
    sources = Sources()
    read: set[str] = set()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        read.update(DATA_FILE.findall(cell.source))
        for output in cell.get("outputs", []):
            if "text" in output:
                sources.add_text(output["text"])
            for kind in ("text/plain", "text/html", "text/markdown"):
                if kind in output.get("data", {}):
                    text = output["data"][kind]
                    sources.add_text(html.unescape(re.sub(r"<[^>]+>", " ", text)) if kind == "text/html" else text)
    for name in sorted(read):
        path = data_dir / name
        assert path.is_file(), f"the notebook reads data/{name}, which does not exist"
        sources.add_data(json.loads(path.read_text(encoding="utf-8")))
    sources.freeze()
    return sources


def prose_cells(notebook: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, prose): markdown cells, and the caption and alt text a code cell gives its figure or image."""
    cells = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            cells.append((index, cell.source))
        mystnb = cell.get("metadata", {}).get("mystnb", {})
        for part in ("figure", "image"):
            for key in ("caption", "alt"):
                if isinstance(mystnb.get(part, {}).get(key), str):
                    cells.append((index, mystnb[part][key]))
    return cells


def unsourced_figures(path: Path, allowed: dict[str, dict[str, str]] | None = None) -> list[Unsourced]:
    """Figures the notebook's prose quotes that neither its outputs nor its data hold, and that are not allowed."""
    allowed = ALLOWED if allowed is None else allowed
    notebook = nbformat.read(path, as_version=4)
    sources = notebook_sources(notebook, path.parent / "data")
    exempt = {**allowed.get("*", {}), **allowed.get(path.stem, {})}
    missing = [Unsourced(path.name, index, figure)
               for index, prose in prose_cells(notebook)
               for figure in quoted_figures(prose)
               if figure not in exempt and not sources.holds(figure)]
    return list(dict.fromkeys(missing))  # a figure quoted twice in one cell is reported once


NOTEBOOKS = sorted(CHAPTERS.glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_quoted_figure_has_a_source(path):
    missing = unsourced_figures(path)
    assert not missing, ("figures quoted in prose that no stored output or data file of the notebook holds "
                         "(fix the text, or allow-list a parameter or citation in ALLOWED):\n"
                         + "\n".join(map(str, missing)))


def test_every_allowed_figure_is_still_quoted():
    quoted = {path.stem: {figure for _, prose in prose_cells(nbformat.read(path, as_version=4))
                          for figure in quoted_figures(prose)} for path in NOTEBOOKS}
    quoted["*"] = set().union(*quoted.values())
    stale = [f"{stem}: {figure}" for stem, figures in ALLOWED.items() for figure in figures
             if figure not in quoted.get(stem, set())]
    assert not stale, "allow-listed figures no longer quoted (remove them from ALLOWED):\n" + "\n".join(stale)


def test_a_stale_figure_is_reported(tmp_path):
    """Plant figures no output holds in a copy of chapter 04 and its data: the checker names the notebook and cell."""
    (tmp_path / "data").mkdir()
    shutil.copy(CHAPTERS / "data" / "04-snowball.json", tmp_path / "data")
    notebook = nbformat.read(CHAPTERS / "04-autoregressive.ipynb", as_version=4)
    cell = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "markdown" and "0.213" in c.source)
    copy = tmp_path / "04-autoregressive.ipynb"
    nbformat.write(notebook, copy)
    assert unsourced_figures(copy, allowed={}) == []

    notebook.cells[cell].source = notebook.cells[cell].source.replace("0.213", "0.231")  # a digit swapped
    notebook.cells[cell].source += ("\n\n错字之后，下一个真实字的平均 log 概率从 −1.02 掉到 −8.66，"
                                    "只有 97.1% 恢复；`top_p=0.95` 是代码，不是数字。")
    nbformat.write(notebook, copy)
    assert [str(u) for u in unsourced_figures(copy, allowed={})] == [
        f"04-autoregressive.ipynb cell {cell}: {figure}" for figure in ("0.231", "−1.02", "−8.66", "97.1%")]


@pytest.mark.parametrize("prose, figures", [
    ("合法率 89.0%（84.0%–93.5%），perplexity 1.805", ["89.0%", "84.0%", "93.5%", "1.805"]),
    ("5.7–9.7%（论文 6.1–9.8%）", ["5.7%", "9.7%", "6.1%", "9.8%"]),
    ("Llama-3.1-8B、Qwen2.5-7B 与表 4.1、图 5 里的 `top_p=0.95`", []),
    ("```python\nx = 0.5\n```\n```{note} 标题 0.5%\n均值 0.213\n```\n````{tip}\n```python\ny = 0.7\n```\n````", ["0.5%", "0.213"]),
    ("KL 只有 $3.0 \\times 10^{-5}$ nats，监听 127.0.0.1", ["3.0 \\times 10^{-5}"]),
    ("从 −1.02 掉到 −8.66，200 篇文档", ["−1.02", "−8.66"]),
])
def test_quoted_figures(prose, figures):
    assert quoted_figures(prose) == figures


@pytest.mark.parametrize("figure, held", [
    ("89.0%", True), ("0.890", True), ("89%", True), ("0.213", True), ("0.21", True), ("21.3%", True),
    ("0.2130", False), ("0.214", False), ("−1.805", True), ("1.81", True), ("1.8051", False),
    ("3.0 \\times 10^{-5}", True), ("3.1 \\times 10^{-5}", False), ("0.0004", True), ("96.9%", True), ("97%", True),
    ("0.0005", False), ("1.00", False),
])
def test_sources_hold_a_figure_at_its_precision(figure, held):
    sources = Sources()
    sources.add_text("合语法 89.0% [84.0%, 93.5%]  TV 0.213  PPL 1.805  KL 3.04e-05")
    sources.add_data({"tv": [0.00041, {"share": 0.969}], "name": "tiny-zh", "exact": True})
    sources.freeze()
    assert sources.holds(figure) is held
