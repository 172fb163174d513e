"""Chapter 01's softmax explorer in headless Chromium, with no kernel and no network: the ESM mirrors
`softmax_state`; dragging one logit moves the softmax and log-softmax bars to what Python computes, and the shift
slider moves every logit while no probability changes.

Two pages: a standalone page that embeds one widget's saved state with the book's offline loaders, and chapter 01
of the built book (at 1366 px and 390 px; screenshots in _build/screenshots/softmax-explorer-*.png).
"""
from __future__ import annotations

import base64
from pathlib import Path

import pytest

from browser import saved_widget_states, served_page, write_standalone_site
from decodelab.book.widgets.softmax_explorer import SoftmaxExplorer, softmax_state

ROOT = Path(__file__).resolve().parents[2]
ESM = ROOT / "lib" / "decodelab" / "book" / "widgets" / "softmax_explorer.js"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHAPTER = "chapters/01-logits-to-probs"
TIMEOUT_MS = 30_000

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory) -> tuple[Path, SoftmaxExplorer]:
    site = tmp_path_factory.mktemp("softmax-site")
    widget = SoftmaxExplorer(["家", "村", "海", "机", "霜"], [7.2, 7.1, 6.0, 3.0, -4.0])
    write_standalone_site(site, widget, title="softmax")
    return site, widget


def shown(page) -> list[dict]:
    """Each row's token, logit, probability and log-probability as drawn, and its two bars' widths."""
    return page.eval_on_selector_all(".dl-softmax-row", """rows => rows.map((r) => ({
        token: r.dataset.token, logit: parseFloat(r.dataset.logit), prob: parseFloat(r.dataset.prob),
        log_prob: parseFloat(r.dataset.logProb), prob_width: r.querySelector('.dl-softmax-prob').style.width,
        log_width: r.querySelector('.dl-softmax-log').style.width}))""")


def assert_shows(page, logits: list[float], shift: float) -> None:
    state = softmax_state(logits, shift)
    rows = shown(page)
    assert [row["logit"] for row in rows] == pytest.approx(state.logits.tolist(), abs=2e-6)
    assert [row["prob"] for row in rows] == pytest.approx(state.probs.tolist(), abs=2e-6)
    assert [row["log_prob"] for row in rows] == pytest.approx(state.log_probs.tolist(), abs=2e-6)


def drag(page, selector: str, presses: int, key: str) -> None:
    """Move a range input with the keyboard, as a reader does with focus on it: one step (0.1) per press."""
    slider = page.locator(selector).first
    slider.focus()
    for _ in range(presses):
        slider.press(key)


def check_logit_and_shift(page, logits: list[float], shift: float) -> None:
    """Raise the last token's logit by 2 and see its bars grow and every other probability shrink; then shift all
    logits by +1 and see the logits move while the bars hold still."""
    assert_shows(page, logits, shift)
    before = shown(page)
    last = len(logits) - 1
    drag(page, f'.dl-softmax input[data-index="{last}"]', 20, "ArrowRight")
    logits = [*logits[:-1], round(logits[-1] + 2.0, 1)]
    page.wait_for_function(f"() => document.querySelectorAll('.dl-softmax-row')[{last}].dataset.logit === "
                           f"'{logits[-1] + shift:.6f}'")
    after = shown(page)
    assert_shows(page, logits, shift)
    assert after[last]["prob"] > before[last]["prob"] and after[last]["prob_width"] != before[last]["prob_width"]
    assert after[last]["log_width"] != before[last]["log_width"]
    assert all(a["prob"] < b["prob"] for a, b in zip(after[:-1], before[:-1]))
    drag(page, '.dl-softmax input[data-param="shift"]', 10, "ArrowRight")
    page.wait_for_function(f"() => document.querySelector('.dl-softmax-row').dataset.logit === "
                           f"'{logits[0] + shift + 1.0:.6f}'")
    moved = shown(page)
    assert_shows(page, logits, round(shift + 1.0, 1))
    assert [row["prob"] for row in moved] == pytest.approx([row["prob"] for row in after], abs=2e-6)
    assert [row["log_prob"] for row in moved] == pytest.approx([row["log_prob"] for row in after], abs=2e-6)


def test_esm_compute_mirrors_python(browser, standalone_site):
    site, _ = standalone_site
    cases = [([7.2, 7.1, 3.0], 0.0), ([1000.0, 999.0, -50.0], -5.0), ([0.0, -200.0, -1.0], 2.5), ([3.3, 3.3], 0.1)]
    source = base64.b64encode(ESM.read_bytes()).decode()
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS) as page:
        # the view uses the shared prelude's helpers; computing needs none of them
        results = page.evaluate("""async ([source, cases]) => {
            const module = await import(`data:text/javascript;base64,${source}`);
            return cases.map(([logits, shift]) => module.softmaxState(logits, shift));
          }""", [source, cases])
    for (logits, shift), result in zip(cases, results):
        state = softmax_state(logits, shift)
        assert result["probs"] == pytest.approx(state.probs.tolist(), abs=1e-12)
        assert result["log_probs"] == pytest.approx(state.log_probs.tolist(), abs=1e-9)
        assert result["log_sum_exp"] == pytest.approx(state.log_sum_exp, abs=1e-9)


def test_dragging_a_logit_moves_the_bars_on_a_standalone_page(browser, standalone_site):
    site, widget = standalone_site
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS, viewport={"width": 1200, "height": 900},
                     wait_for=".dl-softmax-row") as page:
        check_logit_and_shift(page, list(widget.logits), widget.shift)


@pytest.mark.parametrize("width", [1366, 390])
def test_dragging_a_logit_moves_the_bars_in_the_chapter(browser, built_book, width):
    saved = [state for state in saved_widget_states(built_book / f"{CHAPTER}.html")
             if state.get("_anywidget_id", "").endswith("softmax_explorer.SoftmaxExplorer")]
    assert len(saved) == 1, f"expected one SoftmaxExplorer in {CHAPTER}, found {len(saved)}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with served_page(browser, built_book, f"{CHAPTER}.html", timeout_ms=TIMEOUT_MS,
                     viewport={"width": width, "height": 900}, wait_for=".dl-softmax-row") as page:
        widget = page.locator(".dl-softmax").first
        widget.scroll_into_view_if_needed()
        box = widget.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, f"the explorer overflows {width} px: {box}"
        check_logit_and_shift(page, saved[0]["logits"], saved[0]["shift"])
        widget.screenshot(path=str(SCREENSHOTS / f"softmax-explorer-{width}.png"))


def test_lecture_mode_fits_a_slide_with_large_labels(browser, tmp_path):
    """lecture=True: labels at 21 px, and the whole explorer (6 rows, the shift slider) inside a 1366 × 768 window."""
    widget = SoftmaxExplorer(["机", "操", "家", "村", "树", "草"], [7.2, 7.1, 7.1, 7.1, 1.5, 1.1], lecture=True)
    write_standalone_site(tmp_path, widget, title="softmax lecture")
    with served_page(browser, tmp_path, "index.html", timeout_ms=TIMEOUT_MS, viewport={"width": 1366, "height": 768},
                     wait_for=".dl-softmax.dl-lecture .dl-softmax-row") as page:
        box = page.locator(".dl-softmax").bounding_box()
        font = page.locator(".dl-softmax-token").first.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1366 and box["y"] + box["height"] <= 768, box
        assert font >= 21, font
        check_logit_and_shift(page, list(widget.logits), widget.shift)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "softmax-explorer-lecture.png"))
