"""The PagedAttention stepper in headless Chromium, no kernel, no network: pressing Next shows the next recorded
engine state (block tables, ref counts, free queue), Prev goes back.

Two pages: a standalone page that embeds one stepper's saved state with the book's offline loaders (fast), and
chapter 07 of the built book.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from browser import saved_widget_states, served_page, watch, write_standalone_site
from decodelab.engine.engine import Engine
from decodelab.sampling.sampler import SamplingParams
from decodelab.book.widgets.paged_stepper import Arrival, PagedStepper, record_frames

CHAPTER = "chapters/07-paged-attention"
TIMEOUT_MS = 30_000

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def standalone_site(tmp_path_factory, random_llama) -> tuple[Path, PagedStepper]:
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    arrivals = [Arrival(0, tuple(range(10, 19)), greedy), Arrival(1, tuple(range(30, 35)), greedy),
                Arrival(3, (7, 8), SamplingParams(temperature=1.0, seed=0, n=2, max_tokens=5, ignore_eos=True))]
    frames = record_frames(Engine(random_llama, block_size=4, num_blocks=10, max_num_seqs=4), arrivals, token_text=str)
    widget = PagedStepper(frames, block_size=4, index=0)
    site = tmp_path_factory.mktemp("stepper-site")
    write_standalone_site(site, widget, title="stepper")
    return site, widget


def shown_state(page) -> dict:
    """What the stepper draws now: the step, each block table row, each block's ref count, the free queue."""
    return page.evaluate("""() => ({
        step: parseInt(document.querySelector('.dl-paged-head').dataset.step, 10),
        tables: Object.fromEntries([...document.querySelectorAll('.dl-paged-tables tr[data-seq]')]
                  .map((r) => [r.dataset.seq, r.dataset.blocks])),
        refs: [...document.querySelectorAll('.dl-paged-block')].map((b) => parseInt(b.dataset.ref, 10)),
        free: document.querySelector('.dl-paged-free-queue').dataset.free,
    })""")


def expected_state(frame: dict) -> dict:
    return {"step": frame["step"],
            "tables": {str(s["seq"]): ",".join(map(str, s["blocks"])) for s in frame["sequences"]},
            "refs": frame["ref_counts"], "free": ",".join(map(str, frame["free"]))}


def press_through(page, frames: list[dict], start: int) -> None:
    """Press Next from frame `start` to the end, checking every frame, then Prev once."""
    assert shown_state(page) == expected_state(frames[start])
    changed = False
    for index in range(start + 1, len(frames)):
        before = shown_state(page)
        page.locator(".dl-paged-next").first.click()
        now = shown_state(page)
        assert now == expected_state(frames[index]), index
        changed |= now["tables"] != before["tables"]
    assert changed, "pressing Next never changed a block table"
    assert page.locator(".dl-paged-next").first.is_disabled()
    page.locator(".dl-paged-prev").first.click()
    assert shown_state(page) == expected_state(frames[-2])


def test_next_steps_through_a_standalone_page(browser, standalone_site):
    site, widget = standalone_site
    with served_page(browser, site, "index.html", timeout_ms=TIMEOUT_MS,
                     viewport={"width": 1200, "height": 900}, wait_for=".dl-paged-block") as page:
        press_through(page, widget.frames, widget.index)


def saved_stepper_state(html: Path) -> dict:
    steppers = [state for state in saved_widget_states(html) if "frames" in state]
    assert len(steppers) == 1, f"expected one PagedStepper on {html.name}, found {len(steppers)}"
    return steppers[0]


def test_next_changes_the_block_table_in_the_book(browser, built_book):
    saved = saved_stepper_state(built_book / f"{CHAPTER}.html")
    with served_page(browser, built_book, f"{CHAPTER}.html", timeout_ms=TIMEOUT_MS,
                     viewport={"width": 1280, "height": 900}, wait_for=".dl-paged-block") as page:
        press_through(page, saved["frames"], saved["index"])


def test_cost_explorer_esm_mirrors_python(browser):
    """The cost explorer's browser arithmetic (costState) equals decodelab.book.widgets.cost.cost_state."""
    import base64

    from transformers import LlamaConfig

    from decodelab.book.widgets.cost import GPUS, CostExplorer, cost_state, model_spec

    spec = model_spec("Llama-3-8B", LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256))
    cases = [(gpu, batch, context) for gpu in GPUS for batch in (1, 32, 512) for context in (512, 131072)]
    source = base64.b64encode(CostExplorer([spec])._esm.encode()).decode()
    page = browser.new_page()
    problems = watch(page)
    page.goto("about:blank")
    results = page.evaluate(
        """async ([source, model, cases]) => {
             const module = await import(`data:text/javascript;base64,${source}`);
             return cases.map(([gpu, batch, context]) => module.costState(model, gpu, batch, context, 2));
           }""",
        [source, vars(spec), [[vars(g), b, c] for g, b, c in cases]])
    page.close()
    assert not problems.summary(), problems.summary()
    for (gpu, batch, context), result in zip(cases, results):
        state = cost_state(spec, gpu, batch, context)
        assert result["fits"] == state.fits and result["max_batch"] == state.max_batch
        for name in ("weight_bytes", "kv_bytes", "intensity", "memory_ms", "compute_ms", "step_ms", "tokens_per_s",
                     "prefill_ms"):
            assert result[name] == pytest.approx(getattr(state, name), rel=1e-12), name
