"""JupyterLab as students and instructors use it, in Debian's Chromium driven by Playwright.

One JupyterLab (tests/lab.py: isolated config, news off, the venv's kernel) serves temporary copies of the
notebooks, so nothing committed is modified:
- a student runs a starter exercise, sees the Chinese "not done yet" message, types a plausible wrong answer and
  gets the hint written for that mistake, types a correct answer and the check passes;
- an instructor runs a chapter, moves a live widget's slider and presses its button with the keyboard, and the
  figure and the numbers change (and, for the explorer, the kernel's Python object sees the new value);
- lecture mode: setting `lecture=True` on the live explorer from the kernel enlarges it for a room, and a chapter
  given slide metadata by scripts/add_slide_metadata.py is presented as slides with jupyterlab-deck (inside
  JupyterLab, so the widgets stay live): the arrow keys go from slide to slide, and on the explorer's slide they
  move its slider instead, the bars change and the kernel sees the new temperature.
Screenshots of every step: _build/screenshots/lab-*.png.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from browser import watch
from lab import (
    cells,
    slide_cells,
    start_deck,
    stop_deck,
    execution_count,
    open_notebook,
    output_text,
    run_all,
    running_lab,
    shutdown_kernels,
    screenshot,
    set_cell_source,
    wait_kernel_idle,
)

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = ROOT / "exercises" / "01-logits-to-probs.ipynb"
EXPLORER_CHAPTER = ROOT / "chapters" / "02-temperature.ipynb"
STEPPER_CHAPTER = ROOT / "chapters" / "07-paged-attention.ipynb"
SLIDE_SCRIPT = ROOT / "scripts" / "add_slide_metadata.py"
EXPLORER_SLIDE = "自己动手：分布探索器"  # the `##` heading of the explorer's slide in chapter 02
TIMEOUT_MS = 60_000

pytestmark = pytest.mark.browser

# exercises/01-logits-to-probs.ipynb: cell 3 holds the TODO `stable_softmax`, cell 4 runs check_stable_softmax.
TODO_CELL, CHECK_CELL = 3, 4
NOT_DONE = "函数还没有实现：把 `raise NotImplementedError` 换成你的代码。"
# The most common mistake: exp without subtracting the max. Right on small logits, nan at logits 1000.
WRONG_ANSWER = '''def stable_softmax(logits: torch.Tensor) -> torch.Tensor:
    exps = torch.exp(logits)
    return exps / exps.sum(dim=-1, keepdim=True)
'''
WRONG_HINT = "exp(1000) 在 float32 里溢出成 inf，inf / inf = nan"
RIGHT_ANSWER = '''def stable_softmax(logits: torch.Tensor) -> torch.Tensor:
    exps = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    return exps / exps.sum(dim=-1, keepdim=True)
'''
PASSED = "通过 ✔ softmax 在 [V] 和 [B, V] 上都正确"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A folder laid out like the repository (exercises/, chapters/ with its data/), holding copies."""
    root = tmp_path_factory.mktemp("lab-root")
    for notebook in (EXERCISE, EXPLORER_CHAPTER, STEPPER_CHAPTER):
        target = root / notebook.parent.name / notebook.name
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(notebook, target)
    if (ROOT / "chapters" / "data").is_dir():
        shutil.copytree(ROOT / "chapters" / "data", root / "chapters" / "data")
    return root


@pytest.fixture(scope="module")
def lab(served):
    with running_lab(served) as lab:
        yield lab


@pytest.fixture()
def page(browser, lab):
    context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="zh-CN")
    context.set_default_timeout(TIMEOUT_MS)
    problems = watch(context)
    page = context.new_page()
    page.problems = problems
    yield page
    context.close()
    shutdown_kernels(lab)


def _assert_no_page_problems(page, lab) -> None:
    problems = page.problems
    serious = problems.page_errors + problems.failed_requests + problems.external_requests
    assert not serious, f"{problems.summary()}\n--- server log ---\n{lab.log_tail()}"


def _show(page, locator, name: str) -> None:
    locator.scroll_into_view_if_needed()
    screenshot(page, name)


def test_student_works_an_exercise(page, lab, served):
    committed = _sha256(EXERCISE)
    open_notebook(page, lab, f"exercises/{EXERCISE.name}")
    run_all(page)
    check = cells(page).nth(CHECK_CELL)
    assert NOT_DONE in output_text(page, CHECK_CELL), output_text(page, CHECK_CELL)[-800:]
    _show(page, check.locator(".jp-OutputArea"), "student-1-not-done")

    set_cell_source(page, TODO_CELL, WRONG_ANSWER)
    first_run = execution_count(page, CHECK_CELL)
    run_all(page)
    assert execution_count(page, CHECK_CELL) > first_run
    wrong = output_text(page, CHECK_CELL)
    assert WRONG_HINT in wrong and NOT_DONE not in wrong, wrong[-800:]
    _show(page, check.locator(".jp-OutputArea"), "student-2-hint")

    set_cell_source(page, TODO_CELL, RIGHT_ANSWER)
    run_all(page)
    right = output_text(page, CHECK_CELL)
    assert PASSED in right and "CheckFailed" not in right, right[-800:]
    _show(page, check.locator(".jp-OutputArea"), "student-3-passed")

    _assert_no_page_problems(page, lab)
    assert _sha256(EXERCISE) == committed, "the committed exercise was modified"
    assert (served / "exercises" / EXERCISE.name).is_file()


def _explorer_snapshot(widget) -> dict:
    return {
        "stats": widget.locator(".dl-explorer-stats").first.text_content(),
        "bars": widget.locator(".dl-explorer-row").evaluate_all(
            "rows => rows.map(r => [r.dataset.token, r.dataset.prob, r.className,"
            " r.querySelector('.dl-explorer-bar-after').style.width])"),
        "temperature": widget.locator('input[data-param="temperature"]').input_value(),
    }


def _kernel_says(page, expression: str) -> str:
    """Add a cell below the last one, print `expression` in the kernel, return what it printed."""
    count = cells(page).count()
    cells(page).nth(count - 1).locator(".jp-InputPrompt").click()  # select the last cell, command mode
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    cells(page).nth(count).wait_for()
    set_cell_source(page, count, f"print({expression})")
    cells(page).nth(count).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")
    output = cells(page).nth(count).locator(".jp-OutputArea-output")
    output.first.wait_for()
    wait_kernel_idle(page)
    return output_text(page, count).strip()


def _run_chapter_widget(page, lab, chapter: Path, selector: str):
    """Open the served copy of `chapter`, run all its cells, and return the first widget matching `selector`."""
    open_notebook(page, lab, f"chapters/{chapter.name}")
    run_all(page, timeout_ms=180_000)
    widget = page.locator(selector).first
    widget.wait_for()
    return widget


def test_instructor_moves_the_temperature_explorer(page, lab):
    widget = _run_chapter_widget(page, lab, EXPLORER_CHAPTER, ".dl-explorer")
    widget.scroll_into_view_if_needed()
    before = _explorer_snapshot(widget)
    screenshot(page, "explorer-1-before")

    temperature = widget.locator('input[data-param="temperature"]')
    temperature.focus()
    for _ in range(10):  # 10 steps of 0.05: T 1.00 -> 0.50, a sharper distribution
        page.keyboard.press("ArrowLeft")
    after_slider = _explorer_snapshot(widget)
    assert after_slider["temperature"] == "0.5", after_slider["temperature"]
    assert after_slider["stats"] != before["stats"] and after_slider["bars"] != before["bars"]
    screenshot(page, "explorer-2-temperature")

    widget.locator('input[data-param="min_p"]').focus()
    for _ in range(20):  # min-p 0.20, still off: nothing may change yet
        page.keyboard.press("ArrowRight")
    assert _explorer_snapshot(widget)["bars"] == after_slider["bars"]
    widget.locator('input[data-param="use_min_p"]').focus()
    page.keyboard.press("Space")  # the min-p switch, pressed with the keyboard
    after_toggle = _explorer_snapshot(widget)
    kept = [int(n) for n in widget.locator(".dl-explorer-stats").evaluate_all("s => s.map(e => e.dataset.keptCount)")]
    assert after_toggle["stats"] != after_slider["stats"], "switching min-p on changed no number"
    assert any("dl-removed" in row[2] for row in after_toggle["bars"]), "min-p 0.2 removed no token"
    screenshot(page, "explorer-3-min-p")

    said = _kernel_says(page, "explorer.temperature, explorer.use_min_p, explorer.min_p, "
                              "[s.kept_count for s in explorer.states()]")
    assert said == f"0.5 True 0.2 {kept}", f"the kernel's explorer disagrees with the page: {said!r} vs {kept}"

    font = "e => parseFloat(getComputedStyle(e).fontSize)"
    normal_size = widget.evaluate(font)
    _kernel_says(page, "setattr(explorer, 'lecture', True) or explorer.lecture")  # what an instructor types
    widget.scroll_into_view_if_needed()
    assert "dl-lecture" in widget.get_attribute("class") and widget.evaluate(font) >= 1.5 * normal_size, (
        f"lecture=True did not enlarge the live explorer: {normal_size}px -> {widget.evaluate(font)}px")
    screenshot(page, "explorer-4-lecture")
    _assert_no_page_problems(page, lab)


def _stepper_snapshot(widget) -> dict:
    return {
        "head": widget.locator(".dl-paged-head").text_content(),
        "pool": widget.locator(".dl-paged-block").evaluate_all("cells => cells.map(c => c.dataset.ref + ':' + c.innerText)"),
        "tables": widget.locator(".dl-paged-tables tr").evaluate_all("rows => rows.map(r => r.dataset.blocks)"),
        "label": widget.locator(".dl-paged-label").text_content(),
    }


def test_instructor_steps_the_paged_attention_stepper(page, lab):
    widget = _run_chapter_widget(page, lab, STEPPER_CHAPTER, ".dl-paged")
    widget.scroll_into_view_if_needed()
    before = _stepper_snapshot(widget)
    screenshot(page, "stepper-1-before")

    widget.locator(".dl-paged-slider").focus()
    page.keyboard.press("ArrowRight")
    after_slider = _stepper_snapshot(widget)
    start = int(before["label"].split("/")[0])
    assert after_slider["label"].startswith(f"{start + 1} /"), after_slider["label"]
    assert after_slider["head"] != before["head"]
    screenshot(page, "stepper-2-slider")

    widget.locator(".dl-paged-next").focus()
    page.keyboard.press("Enter")
    page.keyboard.press("Space")
    after_button = _stepper_snapshot(widget)
    assert after_button["label"].startswith(f"{start + 3} /"), after_button["label"]
    assert after_button["head"] != after_slider["head"]
    assert (after_button["pool"], after_button["tables"]) != (before["pool"], before["tables"]), (
        "three steps later the block pool and block tables look the same")
    screenshot(page, "stepper-3-next")
    assert re.search(r"第 \d+ 步", after_button["head"])
    _assert_no_page_problems(page, lab)


def test_instructor_presents_a_chapter_as_slides(page, lab, served):
    """Lecture mode as README's instructor section gives it: slide metadata, Run All, `lecture=True`, the deck."""
    slides = served / "chapters" / "02-temperature-slides.ipynb"
    notebook = json.loads(EXPLORER_CHAPTER.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:  # start from a chapter without slide metadata, as an instructor's own notebook
        cell["metadata"].pop("slideshow", None)
    slides.write_text(json.dumps(notebook, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    added = subprocess.run([sys.executable, str(SLIDE_SCRIPT), str(slides)], capture_output=True, text=True, timeout=60)
    assert added.returncode == 0 and "added slide metadata" in added.stdout, added.stdout + added.stderr

    widget = _run_chapter_widget(page, lab, slides, ".dl-explorer")
    font = "e => parseFloat(getComputedStyle(e).fontSize)"
    normal_size = widget.evaluate(font)
    assert _kernel_says(page, "setattr(explorer, 'lecture', True) or explorer.lecture") == "True"

    start_deck(page)
    first_slide = slide_cells(page).all_inner_texts()
    assert first_slide and first_slide[0].lstrip().startswith("Temperature"), first_slide
    assert widget.is_hidden(), "the explorer shows on the title slide: the notebook is not presented as slides"
    screenshot(page, "deck-1-title")

    headings = []
    for _ in range(8):  # the explorer's slide is the 4th; the deck's own key binding, in command mode
        if widget.is_visible():
            break
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
        headings.append(slide_cells(page).first.inner_text().split("\n", 1)[0].strip("¶ "))
    assert widget.is_visible() and headings[-1] == EXPLORER_SLIDE, f"slides seen: {headings}"
    assert len(headings) >= 2 and len(set(headings)) == len(headings), f"slides seen: {headings}"
    assert page.locator(".dl-explorer").count() == 1 and slide_cells(page).locator(".dl-explorer").count() == 1
    assert "dl-lecture" in widget.get_attribute("class") and widget.evaluate(font) >= 1.5 * normal_size, (
        f"the explorer on the slide is not in lecture size: {normal_size}px -> {widget.evaluate(font)}px")
    before = _explorer_snapshot(widget)
    screenshot(page, "deck-2-explorer")

    widget.locator('input[data-param="temperature"]').focus()
    for _ in range(10):  # T 1.00 -> 0.50; the arrows must move the slider, not the slides
        page.keyboard.press("ArrowLeft")
    after = _explorer_snapshot(widget)
    assert after["temperature"] == "0.5", after["temperature"]
    assert after["stats"] != before["stats"] and after["bars"] != before["bars"], "the slide's explorer did not respond"
    assert widget.is_visible() and slide_cells(page).first.inner_text().startswith(EXPLORER_SLIDE)
    screenshot(page, "deck-3-temperature")

    stop_deck(page)
    assert _kernel_says(page, "explorer.temperature") == "0.5", "the kernel did not see the slide's slider move"
    _assert_no_page_problems(page, lab)
