"""Every result figure a chapter's prose quotes is held by that chapter's stored outputs or by the data it reads.

A figure is a number with a decimal point or a percent sign (0.213, 89.0%, 49%, −8.66) in a notebook's markdown cell or
in a figure's caption or alt text (cell metadata `mystnb`); those are prose. Its sources are the stored outputs of the
notebook's code cells (stdout, text/plain, text/html, text/markdown) and the chapters/data/*.json files its code reads.
A figure is found when a source holds it at the precision quoted: the same digits, a longer number that rounds to them,
or the other form of a fraction (0.890 ↔ 89.0%); the sign is not compared ("低 0.155" quotes −0.155). Inline code,
code blocks and references to numbered things (表 4.1, 图 5, 式 3.2) are not figures.

The Markdown pages (00-intro.md, 08-choosing-parameters.md, 09-glossary.md, 10-next.md) have no outputs of their own:
they paste each result figure from the chapter that measures it, with myst-nb's glue ({glue:text}`03-strategies.ipynb::key:.1%`
on the page, glue("key", value, display=False) in the chapter's last cell). A figure typed on a page must be a parameter
the text sets or recommends, or a figure of a cited paper or spec (PAGE_ALLOWED); a figure from a shipped model's card
(MODEL_CARDS) must be held by that card; one from a chapter whose glue cell is still to come (PENDING) must be held by
that chapter's outputs and data, as a notebook's own figures are. Every pasted key must be glued by the chapter named.
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
        data = json.loads(path.read_text(encoding="utf-8"))
        for provenance in ("command", "library_commit"):  # how the file was made, not a figure
            data.pop(provenance, None)
        sources.add_data(data)
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
    for data in (CHAPTERS / "data").glob("04-*.json"):  # every data file chapter 04 reads
        shutil.copy(data, tmp_path / "data")
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


# ---------------------------------------------------------------------------------------------------------------------
# The Markdown pages: every result figure is pasted.

PAGES = [CHAPTERS / f"{stem}.md" for stem in ("00-intro", "08-choosing-parameters", "09-glossary", "10-next")]
GLUE_ROLE = re.compile(r"\{glue(?::text)?\}`(?P<doc>[\w.-]+)::(?P<key>[\w-]+):(?P<format>[^`]*)`")
ARXIV_LINK = re.compile(r"\[\d{4}\.\d{4,5}\]\(https://arxiv\.org/abs/[^)]+\)")  # a reading list's link text, not a figure
MODEL_CARDS = sorted((ROOT / "lib" / "decodelab" / "models" / "assets").glob("*/README.md"))

_PARAMETER = "a parameter value the text sets, recommends or compares (a setting, not a result)"
_PAPER = "a figure of a cited paper, model card or published spec, quoted with its source beside it"
PAGE_ALLOWED: dict[str, dict[str, str]] = {
    "*": {"95%": "the confidence level of the intervals (95% 区间), a setting of the method, not a result"},
    "00-intro": {
        **dict.fromkeys(["0.95", "1.5", "0.1", "90%"], _PARAMETER),
        "3.10": "the Python version the course needs",
    },
    "08-choosing-parameters": {
        **dict.fromkeys(["0.2", "0.5", "0.6", "0.7", "0.8", "0.95", "1.2", "0.05", "0.1", "1.5", "1.0", "0.02",
                         "0.25", "0.3", "1.3", "1.05", "0.999", "90%"], _PARAMETER),
        **dict.fromkeys(["17.9", "73.66%", "0.28%", "1.48", "12.38", "28.94%"], _PAPER),
    },
    "09-glossary": {
        "0.95": _PARAMETER,
        **dict.fromkeys(["2.5%", "97.5%", "1.96"], "a constant in the definition of a 95% interval (bootstrap, Wilson)"),
        **dict.fromkeys(["1.50", "12.38", "22.73", "73.66%", "0.28%", "60%", "80%", "4%", "55%"], _PAPER),
    },
    "10-next": {
        **dict.fromkeys(["0.8", "0.95"], _PARAMETER),
        **dict.fromkeys(["2.5", "0.2"], _PAPER),
    },
}
# Result figures still typed because their chapter has no glue cell yet: {page: {figure: chapter stem that must hold it}}.
# Each figure here is checked against that chapter's stored outputs and data until the chapter glues it.
PENDING: dict[str, dict[str, str]] = {}
# Model-card figures the intro quotes (parameters, training time, cross-entropy), held by the card it names.
MODEL_CARD_FIGURES: dict[str, set[str]] = {"00-intro": {"11.3"}}


@dataclass(frozen=True)
class PageProblem:
    page: str
    line: str
    problem: str

    def __str__(self) -> str:
        return f"{self.page}: {self.problem}   ← “{self.line}”"


def page_lines(text: str) -> list[str]:
    """The prose lines of a page: code removed (glue roles are inline code), arXiv link texts removed."""
    return [line for line in strip_code(ARXIV_LINK.sub(" ", text)).splitlines() if line.strip()]


def glued_keys(path: Path) -> dict[str, str]:
    """{key: stored text/plain} of every glue(..., display=False) output in a notebook."""
    keys = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            for kind, value in output.get("data", {}).items():
                if name and kind.endswith("text/plain"):
                    keys[name] = value
    return keys


def page_problems(path: Path, chapters: Path = CHAPTERS, allowed=None, pending=None, cards=None) -> list[PageProblem]:
    """Typed result figures on a Markdown page, and pasted keys that their chapter does not glue."""
    allowed = PAGE_ALLOWED if allowed is None else allowed
    pending = PENDING if pending is None else pending
    cards = MODEL_CARD_FIGURES if cards is None else cards
    text = path.read_text(encoding="utf-8")
    exempt = {**allowed.get("*", {}), **allowed.get(path.stem, {})}
    card_sources = Sources()
    for card in MODEL_CARDS:
        card_sources.add_text(card.read_text(encoding="utf-8"))
    card_sources.freeze()
    chapter_sources: dict[str, Sources] = {}
    problems = []
    for line in page_lines(text):
        line = re.sub(r"\s+", " ", line)
        for figure in quoted_figures(line):
            at = line.find(figure.lstrip("−-+").rstrip("%"))
            shown = line[max(at - 30, 0):at + 30].strip()  # the figure in its context
            if figure in exempt:
                continue
            if figure in cards.get(path.stem, set()):
                if not card_sources.holds(figure):
                    problems.append(PageProblem(path.name, shown, f"{figure} is in no model card"))
                continue
            chapter = pending.get(path.stem, {}).get(figure)
            if chapter is None:
                problems.append(PageProblem(path.name, shown, f"typed figure {figure} (paste it with glue, "
                                                              "or allow-list a parameter or citation)"))
                continue
            if chapter not in chapter_sources:
                notebook = chapters / f"{chapter}.ipynb"
                chapter_sources[chapter] = notebook_sources(nbformat.read(notebook, as_version=4), chapters / "data")
            if not chapter_sources[chapter].holds(figure):
                problems.append(PageProblem(path.name, shown, f"{figure} is held by no output or data of {chapter}"))
    glued: dict[str, dict[str, str]] = {}
    for role in GLUE_ROLE.finditer(text):
        doc, key, spec = role.group("doc", "key", "format")
        if not doc.endswith(".ipynb"):  # myst-nb 1.4 finds the document by its file name, suffix included
            problems.append(PageProblem(path.name, role.group(), f"{doc} must name the notebook file ({doc}.ipynb)"))
            continue
        notebook = path.parent / doc
        if doc not in glued:
            glued[doc] = glued_keys(notebook) if notebook.is_file() else {}
        if key not in glued[doc]:
            problems.append(PageProblem(path.name, role.group(), f"{doc} glues no key {key!r}"))
            continue
        try:
            format_pasted(glued[doc][key], spec)
        except (TypeError, ValueError) as error:
            problems.append(PageProblem(path.name, role.group(), f"{doc}::{key} does not format as {spec!r}: {error}"))
    return problems


def format_pasted(stored: str, spec: str) -> str:
    """What myst-nb's {glue:text} shows for a stored text/plain and a format spec (myst_nb.core.variables)."""
    from myst_nb.core.variables import format_plain_text

    if not spec:
        raise ValueError("no format spec: myst-nb reads `doc::key` without one as a key ending in ':'")
    return format_plain_text(stored, spec)


@pytest.mark.parametrize("path", PAGES, ids=[p.stem for p in PAGES])
def test_every_figure_on_a_page_is_pasted(path):
    problems = page_problems(path)
    assert not problems, ("figures typed on a Markdown page, or pasted from a key no chapter glues:\n"
                          + "\n".join(map(str, problems)))


def test_every_allowed_page_figure_is_still_quoted():
    quoted = {path.stem: {f for line in page_lines(path.read_text(encoding="utf-8")) for f in quoted_figures(line)}
              for path in PAGES}
    quoted["*"] = set().union(*quoted.values())
    stale = [f"{stem}: {figure}" for table in (PAGE_ALLOWED, PENDING, MODEL_CARD_FIGURES)
             for stem, figures in table.items() for figure in figures if figure not in quoted.get(stem, set())]
    assert not stale, "allow-listed page figures no longer quoted (remove them):\n" + "\n".join(stale)


def test_a_stale_figure_is_reported_on_a_page(tmp_path):
    """Plant the intro's old snowball figures and a key no chapter glues in a copy of the intro: both are reported."""
    for notebook in CHAPTERS.glob("*.ipynb"):
        (tmp_path / notebook.name).symlink_to(notebook)
    (tmp_path / "data").symlink_to(CHAPTERS / "data")
    page = tmp_path / "00-intro.md"
    text = (CHAPTERS / "00-intro.md").read_text(encoding="utf-8")
    page.write_text(text, encoding="utf-8")
    assert page_problems(page, chapters=tmp_path) == []

    text += ("\n\n错字之后，下一个真实字的平均 log 概率从 −1.02 掉到 −8.66，只有 2.3% 恢复；"
             "合语法 {glue:text}`03-strategies.ipynb::pure_grammatical_stale:.1%`，`top_p=0.95` 是代码。\n")
    text = text.replace("（平坦上下文 $T=2$ 时为", "（平坦上下文 $T=2$ 时为 0.190，即", 1)
    page.write_text(text, encoding="utf-8")
    assert [p.problem.split(" (")[0] for p in page_problems(page, chapters=tmp_path)] == [
        "typed figure 0.190", "typed figure −1.02", "typed figure −8.66", "typed figure 2.3%",
        "03-strategies.ipynb glues no key 'pure_grammatical_stale'"]


def test_a_typed_figure_from_a_pending_chapter_must_still_be_held(tmp_path):
    page = tmp_path / "10-next.md"
    page.write_text("{doc}`07c-serving` 量过：64 req/s 时 static 的 normalized latency 是 75.9，continuous 11.1。\n",
                    encoding="utf-8")
    problems = page_problems(page, pending={"10-next": {"75.9": "07c-serving", "11.1": "07c-serving"}})
    assert [p.problem for p in problems] == ["75.9 is held by no output or data of 07c-serving"]


@pytest.mark.parametrize("stored, spec, shown", [
    ("0.89", ".1%", "89.0%"), ("3993", ",d", "3,993"), ("-7.825371", ".5f", "-7.82537"), ("0.00041", ".4f", "0.0004"),
])
def test_pasted_text_is_formatted_as_myst_nb_does(stored, spec, shown):
    assert format_pasted(stored, spec) == shown


# ---------------------------------------------------------------------------------------------------------------------
# The README's performance tables: every figure in a table row is held by the committed JSON of the run it quotes.

README = ROOT / "README.md"
# "### heading" under "## Performance" (its start) -> the JSON files of the run its tables quote.
README_SOURCES: dict[str, list[str]] = {
    "### The engine's cost per step: where": ["benchmarks/results/engine-targets-b78d215.json"],
    "### Sampling": ["benchmarks/results/sampling-quick.json", "benchmarks/results/gpu/sampling.json"],
    "### Bookkeeping": ["benchmarks/results/bookkeeping-ab-cpu.json", "benchmarks/results/engine-overhead-ab.json",
                        "benchmarks/results/bookkeeping-ab-wall.json", "benchmarks/results/bookkeeping-ab.json",
                        *(f"benchmarks/results/bookkeeping-recheck-{run}.json" for run in (1, 2, 3))],
    "### Serving (": ["benchmarks/results/serving.json", "benchmarks/results/gpu/serving.json"],
    "### Paged decode attention": ["benchmarks/results/gpu/attention.json"],
    "### Roofline": ["chapters/data/06-roofline.json", "chapters/06-prefill-decode-kv-cache.ipynb",
                     "benchmarks/results/gpu/roofline.json"],
    "### Slab reservation vs paged": ["chapters/data/07-slab.json"],
    "### KV sharing": ["chapters/data/07-sharing.json"],
    "### Speculative decoding": ["chapters/data/07b-speculative.json", "chapters/data/07b-speculative-engine.json"],
    "### Serving under load": ["chapters/data/07c-serving-load.json", "chapters/07c-serving.ipynb"],
    "### Constrained decoding": ["chapters/data/07d-constrained.json"],
    "### Best-of-n and pass@k": ["chapters/data/07e-best-of-n.json"],
    "### GPU check": ["benchmarks/results/gpu/env.json", "benchmarks/results/gpu/summary.json"],
    "### Where a GPU decode step goes": ["benchmarks/results/gpu/profile_step.json"],
    "### Counter-based streams": ["benchmarks/results/rng-ab.json", "benchmarks/results/sampler-cost-ab.json"],
    "### The decode step's batch and per-step trims": ["benchmarks/results/step-batch.json",
                                                        "benchmarks/results/step-cost-ab.json",
                                                        "benchmarks/results/step-cost-full-ab.json",
                                                        "benchmarks/results/step-cost-targets.json"],
    "### The draw's fixed costs and the finish rule": ["benchmarks/results/per-step-trims-ab.json",
                                                       "benchmarks/results/per-step-trims-full-ab.json",
                                                       "benchmarks/results/bookkeeping-quiet-ab.json",
                                                       "benchmarks/results/engine-targets.json"],
    "### Inputs at fixed addresses and the sampler's front matter": ["benchmarks/results/step-batch-buffers.json",
                                                                    "benchmarks/results/per-step-buffers-full-ab.json",
                                                                    "benchmarks/results/per-step-buffers-tiny-ab.json",
                                                                    "benchmarks/results/engine-targets-buffers.json"],
    "### Unseeded rows by one uniform": ["benchmarks/results/noise.json", "benchmarks/results/unseeded-uniform-ab.json",
                                         "benchmarks/results/unseeded-uniform-sampler-ab.json",
                                         "benchmarks/results/engine-targets-uniform.json"],
    "### Fewer calls in the draw": ["benchmarks/results/serving.json",
                                    "benchmarks/results/draw-calls-one-sequence-ab.json",
                                    "benchmarks/results/draw-calls-ab.json",
                                    "benchmarks/results/draw-calls-sampler-ab.json",
                                    "benchmarks/results/engine-targets-calls.json"],
    "### The draw after the forward": ["benchmarks/results/cold-draw.json", "benchmarks/results/cold-draw-2.json",
                                       "benchmarks/results/cold-draw-3.json",
                                       *(f"benchmarks/results/engine-targets-drift-{run}.json" for run in "ab1234"),
                                       "benchmarks/results/prepare-before-forward-ab.json"],
    "### Why the default streams stay": ["benchmarks/results/draw-rounding.json"],
    "### Seeded noise by uniforms": ["benchmarks/results/seeded-noise.json", "benchmarks/results/seeded-noise-ab.json",
                                     "benchmarks/results/engine-targets-seeded-noise.json",
                                     "benchmarks/results/noise-thread-ab.json"],
    "### The decodelab III redesign, A/B": ["benchmarks/results/decodelab3-engine-ab.json",
                                            "benchmarks/results/decodelab3-sampler-ab.json"],
}
# Sections whose tables quote a run that kept no JSON (benchmarks/results/ was not committed then); each is named
# here with what would source it, so the gap is visible rather than silent.
README_UNSOURCED: dict[str, str] = {
}
# Ratios a table row shows beside the two figures it divides (the row holds both): {figure: the division}.
README_DERIVED: dict[str, str] = {}
README_RATIO = re.compile(r"(\d+(?:\.\d+)?)×")  # a "29.8×" cell: the ratio itself is the figure


def readme_sections(text: str) -> dict[str, str]:
    """{"### heading": its text up to the next heading} for the sections under "## Performance"."""
    performance = text.split("\n## Performance", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^(### .+)$", performance, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def json_sources(paths: list[str]) -> Sources:
    """Numbers of the JSON files, and of the stored outputs of a chapter listed beside them (it prints the same run
    in the units the README uses: ms rather than seconds, GB/s and shares rather than bytes per second)."""
    sources = Sources()
    for path in paths:
        if path.endswith(".ipynb"):
            notebook = nbformat.read(ROOT / path, as_version=4)
            for cell in notebook.cells:
                for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
                    if "text" in output:
                        sources.add_text(output["text"])
                    for kind in ("text/plain", "text/html", "text/markdown"):
                        if kind in output.get("data", {}):
                            text = output["data"][kind]
                            sources.add_text(html.unescape(re.sub(r"<[^>]+>", " ", text)) if kind == "text/html"
                                             else text)
            continue
        data = json.loads((ROOT / path).read_text(encoding="utf-8"))
        if isinstance(data, dict):  # a list (gpu/summary.json: one object per step) is read item by item
            for provenance in ("command", "library_commit"):
                data.pop(provenance, None)
        sources.add_data(data)
    sources.freeze()
    return sources


def readme_problems(text: str, sources_of=README_SOURCES, unsourced=README_UNSOURCED) -> list[str]:
    problems = []
    for heading, body in readme_sections(text).items():
        key = next((k for k in sources_of if heading.startswith(k)), None)
        if key is None:
            if not any(heading.startswith(k) for k in unsourced):
                problems.append(f"{heading}: no source JSON declared (README_SOURCES) and not listed as unsourced")
            continue
        missing_files = [p for p in sources_of[key] if not (ROOT / p).is_file()]
        if missing_files:
            problems.append(f"{heading}: its source {', '.join(missing_files)} is not committed")
            continue
        sources = json_sources(sources_of[key])
        for row in (line for line in body.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")):
            for figure in quoted_figures(README_RATIO.sub(r"\1", row)):
                if figure not in PAGE_ALLOWED["*"] and figure not in README_DERIVED and not sources.holds(figure):
                    problems.append(f"{heading}: {figure} is held by no figure of {', '.join(sources_of[key])}"
                                    f"   ← {row[:80]}")
    return problems


def test_readme_performance_tables_match_their_json():
    problems = readme_problems(README.read_text(encoding="utf-8"))
    assert not problems, "README performance figures without a source:\n" + "\n".join(problems)


def test_a_list_shaped_json_is_read():
    """gpu/summary.json is a list of steps: its numbers are sources as a dict's are."""
    steps = json.loads((ROOT / "benchmarks/results/gpu/summary.json").read_text(encoding="utf-8"))
    sources = json_sources(["benchmarks/results/gpu/summary.json"])
    assert isinstance(steps, list) and all(sources.holds(f"{step['seconds']}.0") for step in steps)


def test_a_stale_readme_figure_is_reported():
    text = README.read_text(encoding="utf-8")
    row = next(line for line in readme_sections(text)["### KV sharing: parallel sampling and beam search "
                                                       "(`scripts/ch07_sharing.py`)"].splitlines()
               if line.startswith("| document starts"))
    stale = row.replace("5.7%", "5.9%", 1)
    problems = readme_problems(text.replace(row, stale))
    assert [p.split("   ←")[0] for p in problems if "5.9%" in p] == [
        "### KV sharing: parallel sampling and beam search (`scripts/ch07_sharing.py`): 5.9% is held by no figure of "
        "chapters/data/07-sharing.json"]
