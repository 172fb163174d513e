"""Lecture mode on a 1366 × 768 projector: chapter 02's explorer slide, presented with jupyterlab-deck, shows the
whole explorer with `lecture=True`: every bar and both entropy lines inside the window, labels at lecture size.

The slide is rebuilt from the chapter's own cells (its set-up cell on a slide before; the explorer slide's markdown
and code cells verbatim, the code with `lecture=True`), run in tests/lab.py's JupyterLab and presented in place with
jupyterlab-deck, as README's instructor section does."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from browser import watch
from lab import cells, open_notebook, run_all, running_lab, screenshot, start_deck, stop_deck

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "chapters" / "02-temperature.ipynb"
SLIDE_HEADING = "## 自己动手：分布探索器"
VIEWPORT = {"width": 1366, "height": 768}
TIMEOUT_MS = 90_000
LECTURE_FONT_PX = 21  # at least 1.5 × the book's 14 px, as tests/site/test_lab_browser.py asks

pytestmark = pytest.mark.browser

EXPLORER_CELL = "explorer = DistributionExplorer("  # how the chapter's explorer cell starts


# True once the lecture explorer's box is where it was one animation frame earlier (polled by wait_for_function):
# gates on the layout settling, not on a guess of how long the deck's transition takes.
SETTLED = """() => {
    const el = document.querySelector('.dl-explorer.dl-lecture');
    if (!el) return false;
    const now = JSON.stringify(el.getBoundingClientRect());
    const settled = window.__dlLastBox === now;
    window.__dlLastBox = now;
    return settled;
}"""

def _slide_notebook(path: Path) -> int:
    """A notebook of chapter 02's cells: its set-up cell (model, contexts, logits) on a slide of its own, then the
    explorer's slide, its markdown and code cells verbatim but for `lecture=True`; returns the slide's first cell."""
    chapter = json.loads(CHAPTER.read_text(encoding="utf-8"))
    sources = ["".join(cell["source"]) for cell in chapter["cells"]]
    setup = next(i for i, (cell, source) in enumerate(zip(chapter["cells"], sources))
                 if cell["cell_type"] == "code" and "load_model(" in source and "contexts = " in source)
    heading = next(i for i, source in enumerate(sources) if source.startswith(SLIDE_HEADING))
    code = next(i for i in range(heading, len(sources)) if EXPLORER_CELL in sources[i])
    explorer = sources[code].replace("temperature=1.0,", "temperature=1.0, lecture=True,", 1)
    assert "lecture=True" in explorer, sources[code]
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    slide = {"slideshow": {"slide_type": "slide"}}
    notebook.cells = [nbformat.v4.new_code_cell(sources[setup], metadata=slide),
                      *(nbformat.v4.new_markdown_cell(sources[i], metadata=slide if i == heading else {})
                        for i in range(heading, code)),
                      nbformat.v4.new_code_cell(explorer)]
    nbformat.write(notebook, path)
    return 1


def test_lecture_explorer_fits_a_1366x768_slide(browser, tmp_path):
    (tmp_path / "chapters").mkdir()
    slide_start = _slide_notebook(tmp_path / "chapters" / "slide.ipynb")
    shutil.copytree(ROOT / "chapters" / "data", tmp_path / "chapters" / "data")
    with running_lab(tmp_path) as lab:
        context = browser.new_context(viewport=VIEWPORT, locale="zh-CN")
        context.set_default_timeout(TIMEOUT_MS)
        problems = watch(context)
        page = context.new_page()
        open_notebook(page, lab, "chapters/slide.ipynb")
        run_all(page)
        page.locator(".dl-explorer.dl-lecture .dl-explorer-stats").nth(1).wait_for(timeout=TIMEOUT_MS)
        start_deck(page, cell_index=slide_start)
        # the deck's slide transition: wait until the explorer is on the slide and holds still for two frames
        page.locator(".jp-deck-mod-onscreen .dl-explorer.dl-lecture").first.wait_for(state="visible", timeout=TIMEOUT_MS)
        page.wait_for_function(SETTLED, timeout=TIMEOUT_MS)
        # the slide from its top, as the room first sees it: every scrolled box back at 0
        page.evaluate("() => document.querySelectorAll('*').forEach((el) => { if (el.scrollTop) el.scrollTop = 0; })")
        page.wait_for_function(SETTLED, timeout=TIMEOUT_MS)
        height = page.evaluate("() => window.innerHeight")
        width = page.evaluate("() => window.innerWidth")
        boxes = page.evaluate("""() => {
            const rect = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
            const explorer = document.querySelector('.dl-explorer.dl-lecture');
            return {
              explorer: rect(explorer),
              rows: [...explorer.querySelectorAll('.dl-explorer-row')].map(rect),
              stats: [...explorer.querySelectorAll('.dl-explorer-stats')].map(rect),
              heading: rect([...document.querySelectorAll('.jp-Cell.jp-deck-mod-onscreen h2')].pop()),
              font: parseFloat(getComputedStyle(explorer.querySelector('.dl-explorer-row .dl-explorer-value')).fontSize),
            };
        }""")
        screenshot(page, "lecture-explorer-slide-1366x768")
        stop_deck(page)
        context.close()
    assert len(boxes["rows"]) == 24 and len(boxes["stats"]) == 2, boxes
    outside = [box for box in boxes["rows"] + boxes["stats"]
               if box[3] > height or box[1] < 0 or box[2] > width or box[0] < 0]
    assert not outside, (f"{len(outside)} bars or entropy lines outside the {width}×{height} window; the explorer spans "
                         f"{boxes['explorer']}; last entropy line {boxes['stats'][-1]}")
    assert boxes["font"] >= LECTURE_FONT_PX, boxes["font"]
    assert 0 <= boxes["heading"][1] < boxes["explorer"][1], ("the slide's heading is not on screen above the explorer",
                                                          boxes["heading"], boxes["explorer"])
    serious = problems.page_errors + problems.failed_requests + problems.external_requests
    assert not serious, problems.summary()
