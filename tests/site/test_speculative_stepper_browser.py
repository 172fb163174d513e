"""The speculative-decoding stepper in headless Chromium, no kernel, no network: Next and Prev change the round shown,
choosing another draft (or gamma) shows that run's proposals, and at 390 px nothing is wider than the window.

Two pages: a standalone page that embeds one stepper's saved state with the book's offline loaders (fast), and
chapter 07b of the built book at 1366 px and 390 px. Screenshots: _build/screenshots/speculative-stepper-*.png.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import saved_widget_states, served_page, write_standalone_site
from decodelab.models.load import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.decoding.speculative import ModelDraft, NgramDraft
from decodelab.book.widgets.speculative_stepper import SpeculativeStepper, speculative_runs

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHAPTER = "chapters/07b-speculative-decoding"
TIMEOUT_MS = 30_000
VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory) -> tuple[Path, SpeculativeStepper]:
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    small = load_model("tiny-zh-doc-small", device="cpu")[0]
    runs = speculative_runs(target, tokenizer, "这是小明在北京的一天。", SamplingParams(seed=0, max_tokens=24),
                            {"tiny-zh-doc-small": lambda: ModelDraft(small), "n-gram": NgramDraft}, (2, 4))
    widget = SpeculativeStepper(runs, gamma=4)
    site = tmp_path_factory.mktemp("speculative-site")
    write_standalone_site(site, widget, title="speculative stepper")
    return site, widget


def shown_round(page) -> dict:
    """What the stepper draws now: the round number, the proposals and their statuses, the target's token kind."""
    return page.evaluate("""() => {
        const row = document.querySelector('.dl-spec-row');
        return {round: parseInt(document.querySelector('.dl-spec-head').dataset.round, 10),
                tokens: row.dataset.tokens, statuses: row.dataset.statuses,
                kind: row.querySelector('.dl-spec-own').dataset.kind};
    }""")


def expected_round(frame: dict) -> dict:
    return {"round": frame["round"], "tokens": "|".join(d["token"] for d in frame["drafts"]),
            "statuses": "|".join(d["status"] for d in frame["drafts"]), "kind": frame["target"]["kind"]}


def run_of(runs: list[dict], draft: str, gamma: int) -> dict:
    return next(run for run in runs if (run["draft"], run["gamma"]) == (draft, gamma))


# Everything inside the stepper that sticks out of the window, and how far the page scrolls sideways.
OVERFLOW_JS = """() => {
  const width = window.innerWidth;
  const out = [...document.querySelectorAll('.dl-spec, .dl-spec *')]
    .filter((el) => el.getClientRects().length && (el.getBoundingClientRect().right > width + 1
                     || el.getBoundingClientRect().left < -1 || el.scrollWidth > el.clientWidth + 2))
    .map((el) => `${el.className || el.tagName}: ${el.textContent.slice(0, 30)}`);
  return {out, pageWidth: document.documentElement.scrollWidth, width};
}"""


def step_and_switch(page, runs: list[dict], draft: str, gamma: int, index: int, other_draft: str) -> None:
    """From round `index` of (draft, gamma): Next to the end checking each round, Prev once, then choose
    `other_draft`, which must show that run's first round with other proposals."""
    rounds = run_of(runs, draft, gamma)["rounds"]
    assert shown_round(page) == expected_round(rounds[index])
    for i in range(index + 1, len(rounds)):
        page.locator(".dl-spec-next").first.click()
        assert shown_round(page) == expected_round(rounds[i]), i
    assert page.locator(".dl-spec-next").first.is_disabled()
    page.locator(".dl-spec-prev").first.click()
    assert shown_round(page) == expected_round(rounds[-2])
    page.locator(".dl-spec-draft").first.select_option(other_draft)
    other = run_of(runs, other_draft, gamma)["rounds"]
    assert shown_round(page) == expected_round(other[0])
    assert [shown_round(page)["tokens"]] != [expected_round(r)["tokens"] for r in rounds[:1]]
    page.locator(".dl-spec-draft").first.select_option(draft)


def test_stepping_and_choosing_a_draft_on_a_standalone_page(browser, standalone_site):
    site, widget = standalone_site
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS,
                     viewport=VIEWPORTS["desktop"], wait_for=".dl-spec-chip") as page:
        step_and_switch(page, widget.runs, widget.draft, widget.gamma, widget.index, "n-gram")
        page.locator(".dl-spec-gamma").first.select_option("2")
        assert shown_round(page) == expected_round(run_of(widget.runs, widget.draft, 2)["rounds"][0])


def saved_stepper_state(html: Path) -> dict:
    steppers = [state for state in saved_widget_states(html) if "runs" in state]
    assert len(steppers) == 1, f"expected one SpeculativeStepper on {html.name}, found {len(steppers)}"
    return steppers[0]


def check_book_page(browser, html: Path) -> list[Path]:
    """Chapter 07b of the book built in `html` at 1366 px and 390 px: stepping, switching the draft, no overflow at
    either width; returns the screenshots of the stepper (also run by hand against a book built elsewhere)."""
    saved = saved_stepper_state(html / f"{CHAPTER}.html")
    other = next(run["draft"] for run in saved["runs"] if run["draft"] != saved["draft"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shots = []
    for viewport in VIEWPORTS.values():
        with served_page(browser, html, f"{CHAPTER}.html", timeout_ms=TIMEOUT_MS, viewport=viewport,
                         wait_for=".dl-spec-chip") as page:
            stepper = page.locator(".dl-spec").first
            stepper.scroll_into_view_if_needed()
            page.locator(".dl-spec-next").first.click()  # round 2 of the saved run: proposals and a rejection
            overflow = page.evaluate(OVERFLOW_JS)
            assert not overflow["out"] and overflow["pageWidth"] <= overflow["width"] + 1, overflow
            shot = SCREENSHOTS / f"speculative-stepper-{viewport['width']}.png"
            stepper.screenshot(path=str(shot))
            shots.append(shot)
            page.locator(".dl-spec-prev").first.click()
            step_and_switch(page, saved["runs"], saved["draft"], saved["gamma"], saved["index"], other)
            overflow = page.evaluate(OVERFLOW_JS)
            assert not overflow["out"] and overflow["pageWidth"] <= overflow["width"] + 1, overflow
    return shots


def test_stepping_and_choosing_a_draft_in_the_book(browser, built_book):
    check_book_page(browser, built_book)
