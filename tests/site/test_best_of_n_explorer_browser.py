"""The best-of-n explorer in headless Chromium, no kernel, no network: moving n changes the cards and the verifiers'
picks to the stored ones, choosing another question or temperature shows that run's cards, and at 390 px nothing is
wider than the window.

A standalone page that embeds the explorer's saved state with the book's offline loaders (the book is not built).
Screenshots: _build/screenshots/best-of-n-explorer-1366.png and -390.png.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import served_page, write_standalone_site
from decodelab.measure.best_of_n import VERIFIERS
from decodelab.engine.engine import Engine
from decodelab.models.load import load_model
from decodelab.book.widgets.best_of_n_explorer import BestOfNExplorer, best_of_n_frames
from best_of_n_cases import QUESTIONS, TEMPERATURES

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"
TIMEOUT_MS = 30_000
VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
START = "这是老王在成都的一天。"

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory) -> tuple[Path, BestOfNExplorer]:
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    runs = best_of_n_frames(Engine(model, tokenizer, block_size=4), QUESTIONS, TEMPERATURES)
    widget = BestOfNExplorer(runs, question=START, temperature=1.0, n=1)
    site = tmp_path_factory.mktemp("best-of-n-site")
    write_standalone_site(site, widget, title="best-of-n explorer")
    return site, widget


def shown(page) -> dict:
    """What the explorer draws now: the question, temperature and n, each verifier's pick, the cards, pass@k."""
    return page.evaluate("""() => {
        const head = document.querySelector('.dl-bon-head');
        return {question: head.dataset.question, temperature: parseFloat(head.dataset.temperature),
                n: parseInt(head.dataset.n, 10),
                picks: Object.fromEntries([...document.querySelectorAll('.dl-bon-verifier')]
                         .map((row) => [row.dataset.verifier, parseInt(row.dataset.pick, 10)])),
                cards: [...document.querySelectorAll('.dl-bon-card')].map((card) => [
                         parseInt(card.dataset.index, 10), card.dataset.answer, card.dataset.correct === 'true',
                         card.dataset.picked, card.querySelector('.dl-bon-card-text').textContent]),
                pass: document.querySelector('.dl-bon-pass').dataset.values,
                tokens: parseInt(document.querySelector('.dl-bon-cost').dataset.tokens, 10)};
    }""")


def expected(run: dict, n: int) -> dict:
    frame = run["frames"][n - 1]
    return {"question": run["question"], "temperature": run["temperature"], "n": n, "picks": frame["picks"],
            "cards": [[i, s["answer"] or "", s["correct"], ",".join(v for v in VERIFIERS if frame["picks"][v] == i),
                       s["text"]] for i, s in enumerate(run["samples"][:n])],
            "pass": "|".join(f"{v:.4f}" for v in frame["pass_at_k"]), "tokens": frame["tokens"]}


def run_of(runs: list[dict], question: str, temperature: float) -> dict:
    return next(run for run in runs if (run["question"], run["temperature"]) == (question, temperature))


# Everything inside the explorer that sticks out of the window, and how far the page scrolls sideways.
OVERFLOW_JS = """() => {
  const width = window.innerWidth;
  const out = [...document.querySelectorAll('.dl-bon, .dl-bon *')]
    .filter((el) => el.getClientRects().length && (el.getBoundingClientRect().right > width + 1
                     || el.getBoundingClientRect().left < -1 || el.scrollWidth > el.clientWidth + 2))
    .map((el) => `${el.className || el.tagName}: ${el.textContent.slice(0, 30)}`);
  return {out, pageWidth: document.documentElement.scrollWidth, width};
}"""


def assert_fits(page) -> None:
    overflow = page.evaluate(OVERFLOW_JS)
    assert not overflow["out"] and overflow["pageWidth"] <= overflow["width"] + 1, overflow


def test_n_question_and_temperature_on_a_standalone_page(browser, standalone_site):
    site, widget = standalone_site
    run = run_of(widget.runs, START, 1.0)
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS,
                     viewport=VIEWPORTS["desktop"], wait_for=".dl-bon-card") as page:
        assert shown(page) == expected(run, 1)
        picks = []
        for n in range(2, 17):
            page.locator(".dl-bon-more").first.click()
            now = shown(page)
            assert now == expected(run, n), n
            picks.append(tuple(now["picks"].values()))
        assert len(set(picks)) > 1, "moving n never changed a verifier's pick"
        assert page.locator(".dl-bon-more").first.is_disabled()
        slider = page.locator(".dl-bon-slider").first
        slider.focus()
        for _ in range(10):
            page.keyboard.press("ArrowLeft")
        assert shown(page) == expected(run, 6)
        other = QUESTIONS[0].prompt
        page.locator(".dl-bon-question").first.select_option(other)
        assert shown(page) == expected(run_of(widget.runs, other, 1.0), 6)
        assert shown(page)["cards"] != expected(run, 6)["cards"]
        page.locator(".dl-bon-temperature").first.select_option("1.5")
        assert shown(page) == expected(run_of(widget.runs, other, 1.5), 6)
        assert_fits(page)


@pytest.mark.parametrize("viewport", VIEWPORTS.values(), ids=VIEWPORTS.keys())
def test_nothing_is_wider_than_the_window(browser, standalone_site, viewport):
    """At each width: the explorer fits after moving n and switching question; a screenshot of it at n = 8."""
    site, widget = standalone_site
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS, viewport=viewport,
                     wait_for=".dl-bon-card") as page:
        for _ in range(7):
            page.locator(".dl-bon-more").first.click()
        assert shown(page) == expected(run_of(widget.runs, START, 1.0), 8)
        assert_fits(page)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(".dl-bon").first.screenshot(path=str(SCREENSHOTS / f"best-of-n-explorer-{viewport['width']}.png"))
        page.locator(".dl-bon-question").first.select_option(QUESTIONS[3].prompt)  # the longest name
        page.locator(".dl-bon-slider").first.focus()
        page.keyboard.press("End")
        assert shown(page)["n"] == 16
        assert_fits(page)
