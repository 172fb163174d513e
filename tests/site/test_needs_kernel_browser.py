"""The two widgets that compute in the kernel (chapter 03's strategy playground, chapter 04's autoregressive stepper)
never look live while dead (decodelab.book.widgets.kernel_note).

- Without a kernel (a standalone page with one widget's saved state, and chapters 03 and 04 of the built book at
  1366 px and 390 px): the note that a running kernel is needed is visible above the controls, every control is
  disabled, and the stored result is shown.
- In JupyterLab with a kernel (a notebook that builds both widgets, run from the Run menu): the note is gone, the
  controls are enabled, and pressing "下一个 token" draws a token.
Screenshots: _build/screenshots/needs-kernel-*.png and lab-needs-kernel-*.png.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from browser import served_page, write_standalone_site

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"
TIMEOUT_MS = 30_000
NOTE_TEXT = "需要运行中的 Python 内核"
VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
CHAPTERS = {"playground": ("chapters/03-strategies", "合法率"), "stepper": ("chapters/04-autoregressive", "步 · log P")}

pytestmark = pytest.mark.browser

# What a reader meets in the widget output that holds `note`: the note's box, and every control with its state
# (ipywidgets draws sliders as noUiSlider divs with a `disabled` attribute and an editable readout).
WIDGET_STATE_JS = """(note) => {
  const root = note.closest('.widget-subarea, .jp-OutputArea-output');
  const box = note.getBoundingClientRect();
  const controls = [...root.querySelectorAll('input, button, select, textarea')]
    .map((el) => ({kind: el.tagName.toLowerCase(), label: el.title || el.id, disabled: el.disabled,
                   top: el.getBoundingClientRect().top}));
  for (const slider of root.querySelectorAll('.noUi-target')) {
    controls.push({kind: 'slider', label: slider.closest('.widget-slider').innerText,
                   disabled: slider.hasAttribute('disabled'), top: slider.getBoundingClientRect().top});
  }
  for (const readout of root.querySelectorAll('.widget-readout')) {
    controls.push({kind: 'readout', label: readout.innerText, disabled: readout.contentEditable !== 'true',
                   top: readout.getBoundingClientRect().top});
  }
  return {text: note.innerText, left: box.left, right: box.right, top: box.top, width: box.width,
          height: box.height, visibility: getComputedStyle(note).visibility, controls, shown: root.innerText};
}"""


def assert_needs_kernel(page, result_text: str, where: str) -> None:
    """The page shows one note, above the widget's controls, in the window's width; every control is disabled;
    the stored result (`result_text`) is shown."""
    note = page.locator(".dl-kernel-note")
    assert note.count() == 1, f"{where}: {note.count()} kernel notes"
    note.scroll_into_view_if_needed()
    state = note.evaluate(WIDGET_STATE_JS)
    window = page.viewport_size["width"]
    assert state["text"].startswith(NOTE_TEXT) and state["visibility"] == "visible", (where, state["text"])
    assert state["height"] > 10 and 0 <= state["left"] and state["right"] <= window + 1, (where, state)
    controls = state["controls"]
    assert sum(c["kind"] == "slider" for c in controls) >= 3 and sum(c["kind"] == "input" for c in controls) >= 2
    live = [c for c in controls if not c["disabled"]]
    assert not live, f"{where}: controls that look live without a kernel: {live}"
    assert all(c["top"] >= state["top"] + state["height"] - 1 for c in controls), f"{where}: the note is not above"
    assert result_text in state["shown"], f"{where}: the stored result is not shown: {state['shown'][:300]!r}"


@pytest.fixture(scope="module")
def widgets_built(tiny):
    from decodelab.toy.sentences import ToyLanguage
    from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground
    from decodelab.book.widgets.stepper import AutoregressiveStepper

    model, tokenizer = tiny
    return {"playground": StrategyPlayground(model, tokenizer, ToyLanguage(), PlaygroundSettings(strategy="greedy")),
            "stepper": AutoregressiveStepper(model, tokenizer, ToyLanguage(), initial_steps=3)}


@pytest.mark.parametrize("kind", CHAPTERS)
def test_standalone_page_says_the_widget_needs_a_kernel(browser, widgets_built, tmp_path, kind):
    site = tmp_path / kind
    site.mkdir()
    write_standalone_site(site, widgets_built[kind], title=kind)
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS, viewport=VIEWPORTS["desktop"],
                     wait_for=".dl-kernel-note") as page:
        assert_needs_kernel(page, CHAPTERS[kind][1], f"standalone {kind}")
        button = page.locator("button", has_text="下一个 token")
        if button.count():
            before = page.locator(".widget-html-content").inner_text()
            button.click(force=True)  # a click on the disabled button changes nothing
            assert page.locator(".widget-html-content").inner_text() == before


def check_book_pages(browser, html: Path) -> list[Path]:
    """Open chapters 03 and 04 of the book built in `html` at 1366 px and 390 px and check each widget; returns
    the screenshots it took of the widget (also run by hand against a book built elsewhere)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shots = []
    for kind, (chapter, result_text) in CHAPTERS.items():
        for device, viewport in VIEWPORTS.items():
            with served_page(browser, html, f"{chapter}.html", timeout_ms=TIMEOUT_MS, viewport=viewport,
                             wait_for=".dl-kernel-note") as page:
                assert_needs_kernel(page, result_text, f"{chapter} at {viewport['width']} px")
                page.wait_for_timeout(300)
                shot = SCREENSHOTS / f"needs-kernel-{kind}-{viewport['width']}.png"
                page.screenshot(path=str(shot))
                shots.append(shot)
    return shots


def test_book_pages_say_the_widgets_need_a_kernel(browser, built_book):
    check_book_pages(browser, built_book)


LIVE_NOTEBOOK_CELLS = [
    "from decodelab.models.load import load_model\n"
    "from decodelab.toy.sentences import ToyLanguage\n"
    "from decodelab.book.widgets.playground import PlaygroundSettings, StrategyPlayground\n"
    "from decodelab.book.widgets.stepper import AutoregressiveStepper\n"
    "model, tokenizer = load_model('tiny-zh', device='cpu')",
    "playground = StrategyPlayground(model, tokenizer, ToyLanguage(), PlaygroundSettings(strategy='greedy'))\n"
    "playground",
    "stepper = AutoregressiveStepper(model, tokenizer, ToyLanguage(), initial_steps=3)\nstepper",
]


def test_jupyterlab_with_a_kernel_shows_live_widgets_without_the_note(browser, tmp_path):
    import nbformat

    from lab import cells, open_notebook, run_all, running_lab, screenshot, shutdown_kernels

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in LIVE_NOTEBOOK_CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    (tmp_path / "live.ipynb").write_text(json.dumps(notebook, ensure_ascii=False), encoding="utf-8")
    with running_lab(tmp_path) as lab:
        context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="zh-CN")
        context.set_default_timeout(90_000)
        page = context.new_page()
        try:
            open_notebook(page, lab, "live.ipynb")
            run_all(page, timeout_ms=180_000)
            outputs = [cells(page).nth(i).locator(".jp-OutputArea-output").first for i in (1, 2)]
            for output in outputs:
                output.locator(".widget-html-content").first.wait_for()
            # the note is drawn, asks the kernel, and goes; the kernel enables the controls
            page.wait_for_function("() => document.querySelectorAll('.dl-kernel-note').length === 0")
            page.wait_for_function("() => [...document.querySelectorAll('.jp-OutputArea-output .widget-subarea')]"
                                   ".every((area) => !area.querySelector('input:disabled, button:disabled, "
                                   ".noUi-target[disabled]'))")
            stepper = outputs[1]
            stepper.scroll_into_view_if_needed()
            assert "3 步" in stepper.inner_text()
            stepper.locator("button", has_text="下一个 token").click()
            stepper.get_by_text("4 步").first.wait_for()
            screenshot(page, "needs-kernel-live")
        finally:
            context.close()
            shutdown_kernels(lab)
