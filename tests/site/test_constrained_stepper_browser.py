"""The constrained-decoding stepper in headless Chromium, no kernel, no network: Next, Prev and the slider change the
step shown, choosing another case shows that generation's tokens, and at 390 px nothing is wider than the window.

One standalone page that embeds the stepper's saved state with the book's offline loaders (the book is not built
here), with the three cases of chapter 07d. Screenshots: _build/screenshots/constrained-stepper-*.png.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import served_page, write_standalone_site
from decodelab.grammar.backends import LLGuidanceGrammar, ToyLanguageGrammar
from decodelab.models.load import load_model
from decodelab.sampling.sampler import SamplingParams
from decodelab.book.widgets.constrained_stepper import ConstrainedStepper, constrained_frames

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"
TIMEOUT_MS = 30_000
VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
FORM = "(小明|小红)(喜欢吃北京烤鸭|坐(飞机|火车)去北京)。"
CITY = "[^。！？]{0,15}北京[^。！？]{0,15}[。！？]"

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory) -> tuple[Path, ConstrainedStepper]:
    model, tokenizer = load_model("tiny-zh", device="cpu")
    runs = [
        constrained_frames(model, tokenizer, "", SamplingParams(seed=5, max_tokens=40),
                           LLGuidanceGrammar.regex(FORM, tokenizer), "正则：6 句", description=f"正则 {FORM}",
                           log_z=-8.555, log_z_source="6 句全部列出，精确值"),
        constrained_frames(model, tokenizer, "", SamplingParams(seed=0, max_tokens=40),
                           LLGuidanceGrammar.regex(CITY, tokenizer), "正则：提到北京", description=f"正则 {CITY}"),
        constrained_frames(model, tokenizer, "", SamplingParams(temperature=2.0, seed=1, max_tokens=40),
                           ToyLanguageGrammar(tokenizer), "玩具语言自身，T = 2", description="玩具语言自身的自动机"),
    ]
    widget = ConstrainedStepper(runs, title="约束解码的每一步")
    site = tmp_path_factory.mktemp("constrained-site")
    write_standalone_site(site, widget, title="constrained stepper")
    return site, widget


def shown_step(page) -> dict:
    """What the stepper draws now: the step number, the tokens listed and which of them the grammar allows."""
    return page.evaluate("""() => {
        const rows = document.querySelector('.dl-cons-rows');
        return {step: parseInt(document.querySelector('.dl-cons-head').dataset.step, 10),
                tokens: rows.dataset.tokens, allowed: rows.dataset.allowed,
                drawn: rows.querySelector('.dl-cons-drawn').dataset.token,
                text: document.querySelector('.dl-cons-context').textContent,
                logQ: JSON.parse(document.querySelector('.dl-cons-stats').dataset.logQ)};
    }""")


def expected_step(run: dict, index: int) -> dict:
    """What `shown_step` must read at step `index` of `run`; the text is the prompt (or its placeholder), the text
    before this step and this step's token (EOS shown as a marker)."""
    frame = run["steps"][index]
    before = run["steps"][index - 1]["text"] if index else ""
    new = "[EOS]" if frame["eos"] else frame["text"][len(before):]
    return {"step": frame["step"], "tokens": "|".join(row["token"] for row in frame["rows"]),
            "allowed": "".join("1" if row["allowed"] else "0" for row in frame["rows"]), "drawn": frame["token"],
            "text": (run["prompt"] or "（空 prompt）") + before + new, "logQ": frame["log_q"]}


# Everything inside the stepper that sticks out of the window, and how far the page scrolls sideways.
OVERFLOW_JS = """() => {
  const width = window.innerWidth;
  const out = [...document.querySelectorAll('.dl-cons, .dl-cons *')]
    .filter((el) => el.getClientRects().length && (el.getBoundingClientRect().right > width + 1
                     || el.getBoundingClientRect().left < -1 || el.scrollWidth > el.clientWidth + 2))
    .map((el) => `${el.className || el.tagName}: ${el.textContent.slice(0, 30)}`);
  return {out, pageWidth: document.documentElement.scrollWidth, width};
}"""


def assert_fits(page) -> None:
    overflow = page.evaluate(OVERFLOW_JS)
    assert not overflow["out"] and overflow["pageWidth"] <= overflow["width"] + 1, overflow


@pytest.mark.parametrize("viewport", VIEWPORTS.values(), ids=VIEWPORTS.keys())
def test_stepping_and_choosing_a_case_on_a_standalone_page(browser, standalone_site, viewport):
    site, widget = standalone_site
    run, other = widget.runs[0], widget.runs[1]
    steps = run["steps"]
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS, viewport=viewport,
                     wait_for=".dl-cons-rows") as page:
        assert shown_step(page) == expected_step(run, 0)
        for i in range(1, len(steps)):
            page.locator(".dl-cons-next").click()
            assert shown_step(page) == expected_step(run, i), i
            assert_fits(page)
        assert page.locator(".dl-cons-next").is_disabled()
        assert page.locator(".dl-cons-final").count() == 1  # the finished text against p(x | valid)
        page.locator(".dl-cons-prev").click()
        assert shown_step(page) == expected_step(run, len(steps) - 2)
        # the step where the grammar forces a token the model barely wants (北 after 小明喜欢吃)
        forced = next(i for i, step in enumerate(steps) if step["allowed"] == 1 and step["kept"] < 1e-3)
        page.locator(".dl-cons-slider").fill(str(forced))
        assert shown_step(page) == expected_step(run, forced)
        assert page.locator(".dl-cons-prev").is_enabled() and page.locator(".dl-cons-next").is_enabled()
        assert_fits(page)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator(".dl-cons").screenshot(path=str(SCREENSHOTS / f"constrained-stepper-{viewport['width']}.png"))

        page.locator(".dl-cons-case").select_option(other["case"])
        assert shown_step(page) == expected_step(other, 0)
        assert shown_step(page)["allowed"] != expected_step(run, 0)["allowed"]
        last = len(other["steps"]) - 1
        page.locator(".dl-cons-slider").fill(str(last))
        assert shown_step(page) == expected_step(other, last)
        assert other["text"] in shown_step(page)["text"] and other["text"] != run["text"]
        assert_fits(page)
