"""The distribution explorer in headless Chromium, with no kernel and no network: the ESM mirrors
`explorer_state`, and moving the temperature slider redraws the chart with the distribution Python computes.

Two pages: a small standalone page that embeds one widget's saved state with the same offline loaders the book
serves (fast, independent of the book build), and the real chapter page of the built book.
"""
from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from browser import saved_widget_states, served_page, write_standalone_site
from decodelab.book.widgets.explorer import DistributionExplorer, ExplorerParams, explorer_state, make_context

ROOT = Path(__file__).resolve().parents[2]
ESM = ROOT / "lib" / "decodelab" / "book" / "widgets" / "explorer.js"
TIMEOUT_MS = 30_000

pytestmark = pytest.mark.browser


def _widget() -> DistributionExplorer:
    rng = np.random.default_rng(0)
    tokens = [chr(0x4E00 + 7 * i) for i in range(60)]
    flat = make_context("平坦：小明在", tokens, rng.normal(0.0, 0.5, size=60))
    peaked = make_context("尖锐：床前明月光，疑是地上", tokens, rng.normal(0.0, 3.0, size=60))
    return DistributionExplorer([flat, peaked], temperature=1.0, top_p=0.9)


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory) -> tuple[Path, DistributionExplorer]:
    """A folder laid out like the book's _build/html/_static, with a page that embeds one explorer."""
    site = tmp_path_factory.mktemp("explorer-site")
    widget = _widget()
    write_standalone_site(site, widget, title="explorer")
    return site, widget


def shown_probs(page, panel: int) -> dict[str, float]:
    """token -> probability shown by the bars of one context panel."""
    return page.eval_on_selector_all(
        f".dl-explorer-panel:nth-child({panel + 1}) .dl-explorer-row",
        "rows => Object.fromEntries(rows.map((r) => [r.dataset.token, parseFloat(r.dataset.prob)]))")


def bar_widths(page) -> list[str]:
    return page.eval_on_selector_all(".dl-explorer-bar-after", "bars => bars.map((b) => b.style.width)")


def move_temperature(page, presses: int, key: str) -> None:
    slider = page.locator('.dl-explorer input[data-param="temperature"]').first
    slider.focus()
    for _ in range(presses):
        slider.press(key)


def expected_shown(context: dict, num_bars: int, params: ExplorerParams) -> dict[str, float]:
    state = explorer_state(context["logits"], params)
    order = np.argsort(-np.asarray(context["logits"]), kind="stable")[:num_bars]
    return {context["tokens"][i]: float(state.final_probs[i]) for i in order}


def assert_shows(page, widget: DistributionExplorer | dict, params: ExplorerParams) -> None:
    """The bars show what explorer_state computes; `widget` is the widget or its saved state."""
    contexts = widget["contexts"] if isinstance(widget, dict) else widget.contexts
    num_bars = widget["num_bars"] if isinstance(widget, dict) else widget.num_bars
    for panel, context in enumerate(contexts):
        shown = shown_probs(page, panel)
        expected = expected_shown(context, num_bars, params)
        assert shown.keys() == expected.keys()
        for token, prob in expected.items():
            assert shown[token] == pytest.approx(prob, abs=2e-6), (panel, token, params)


def test_esm_compute_mirrors_python(browser, standalone_site):
    """The browser's computeState gives what explorer_state gives, on random logits and slider values."""
    site, _ = standalone_site
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(40):
        logits = [round(float(x), 4) for x in rng.normal(0.0, rng.uniform(0.3, 4.0), size=int(rng.integers(3, 200)))]
        params = ExplorerParams(temperature=float(rng.choice([0.05, 0.4, 1.0, 2.5])), top_k=int(rng.choice([0, 1, 5, 30])),
                                top_p=float(rng.choice([1.0, 0.9, 0.5, 0.05])), min_p=float(rng.choice([0.0, 0.1])))
        cases.append((logits, params))
    source = base64.b64encode(ESM.read_bytes()).decode()
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS) as page:
        results = page.evaluate(
            """async ([source, cases]) => {
                 const module = await import(`data:text/javascript;base64,${source}`);
                 return cases.map(([logits, params]) => module.computeState(logits, params));
               }""",
            [source, [[logits, vars(params)] for logits, params in cases]])
    for (logits, params), result in zip(cases, results):
        state = explorer_state(logits, params)
        assert result["kept"] == state.kept.tolist(), params
        np.testing.assert_allclose(result["final_probs"], state.final_probs, atol=1e-12)
        assert result["final_entropy"] == pytest.approx(state.final_entropy, abs=1e-12)
        assert result["kept_count"] == state.kept_count


def test_temperature_slider_redraws_a_standalone_page(browser, standalone_site):
    site, widget = standalone_site
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS,
                     viewport={"width": 1200, "height": 900}, wait_for=".dl-explorer-row") as page:
        assert_shows(page, widget, ExplorerParams(temperature=1.0, top_p=0.9))
        kept_before = page.eval_on_selector_all(".dl-explorer-stats", "s => s.map((e) => e.dataset.keptCount)")
        widths_before = bar_widths(page)
        move_temperature(page, 10, "ArrowLeft")  # 1.00 -> 0.50 in steps of 0.05
        assert page.locator(".dl-explorer-control-value").first.text_content() == "0.50"
        assert bar_widths(page) != widths_before
        assert_shows(page, widget, ExplorerParams(temperature=0.5, top_p=0.9))
        kept_after = page.eval_on_selector_all(".dl-explorer-stats", "s => s.map((e) => e.dataset.keptCount)")
        # a colder distribution needs fewer tokens to reach p = 0.9
        assert all(int(a) <= int(b) for a, b in zip(kept_after, kept_before)) and kept_after != kept_before
        page.locator('.dl-explorer input[data-param="use_min_p"]').check()
        assert_shows(page, widget, ExplorerParams(temperature=0.5, top_p=0.9, min_p=0.0))  # the min-p slider is at 0


CHAPTER = "chapters/02-temperature"


def saved_explorer_state(html: Path) -> dict:
    """The DistributionExplorer's saved model state on a built page."""
    explorers = [state for state in saved_widget_states(html)
                 if state.get("_anywidget_id", "").endswith("explorer.DistributionExplorer")]
    assert len(explorers) == 1, f"expected one DistributionExplorer on {html.name}, found {len(explorers)}"
    return explorers[0]


def test_temperature_slider_redraws_the_chapter_page(browser, built_book):
    saved = saved_explorer_state(built_book / f"{CHAPTER}.html")
    start = ExplorerParams(temperature=saved["temperature"], top_k=saved["top_k"], top_p=saved["top_p"])
    with served_page(browser, built_book, f"{CHAPTER}.html", timeout_ms=TIMEOUT_MS,
                     viewport={"width": 1280, "height": 900}, wait_for=".dl-explorer-row") as page:
        assert_shows(page, saved, start)
        widths_before = bar_widths(page)
        move_temperature(page, 10, "ArrowLeft")  # 0.05 per press
        colder = ExplorerParams(temperature=round(saved["temperature"] - 0.5, 2), top_k=saved["top_k"],
                                top_p=saved["top_p"])
        assert page.locator(".dl-explorer-control-value").first.text_content() == f"{colder.temperature:.2f}"
        assert bar_widths(page) != widths_before
        assert_shows(page, saved, colder)
