"""Chapter 01's figures fit a 390 px phone at print size, with no sideways scrolling.

On a phone, book/static/reader.js draws a figure no smaller than its print size (a 10-pt label at 10 CSS px; the
notebooks' PNGs are 150 dpi, so 72/150 CSS px per pixel). A figure wider than the column at that size goes into a box
that scrolls sideways: a 6.4-inch figure is 454 CSS px in a 342 px column, and the right quarter of figure 1.2, where
both overflow points are, was off the screen. A figure drawn at most 4.8 inches wide fits.

- Without a browser: every PNG stored in the chapters of FIT_A_PHONE is at most PHONE_FIGURE_PX wide at print size
  (fails as soon as a re-executed chapter stores a wider figure).
- In Debian's Chromium, on the built book at 390 × 844: each figure of those chapters is shown whole, not in a
  scrolling box, at print size or larger, and the column a figure gets is PHONE_FIGURE_PX (so the constant follows the
  theme). Screenshot (figure 1.2): _build/screenshots/phone-figures-01-logits-to-probs-390.png.

The other chapters' figures are 6.4 inches wide and scroll sideways in their box on a phone (tests/site/test_book.py
accepts a box with a scroll cue); a chapter joins FIT_A_PHONE when its figures are redrawn narrower.
"""
from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
SCREENSHOTS = ROOT / "_build" / "screenshots"
FIT_A_PHONE = ("01-logits-to-probs",)
SHOWN = {"01-logits-to-probs": "fig-overflow"}  # the figure each screenshot shows (else the chapter's first)
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True,
         "locale": "zh-CN"}
# The width a figure's image gets at a 390 px window (sphinx-book-theme 1.3.0: the article's 16 px padding and the
# figure's 8 px margin on each side), measured in Chromium; the browser test below checks it.
PHONE_FIGURE_PX = 342
TIMEOUT_MS = 30_000


def png_width_and_dpi(png: bytes) -> tuple[int, float]:
    """The pixel width (IHDR) and horizontal resolution (pHYs, dots per inch) of a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width = struct.unpack(">I", png[16:20])[0]
    at = png.find(b"pHYs")
    if at < 0:
        raise ValueError("the PNG has no pHYs chunk, so its print size is unknown")
    per_metre_x, _, unit = struct.unpack(">IIB", png[at + 4:at + 13])
    if unit != 1:
        raise ValueError(f"pHYs unit must be 1 (metre), got {unit}")
    return width, per_metre_x * 0.0254


def print_width_css_px(png: bytes) -> float:
    """The CSS width at which a 10-pt label of the PNG is 10 CSS px (what reader.js draws at least, on a phone)."""
    width, dpi = png_width_and_dpi(png)
    return width * 72 / dpi


def stored_figures(stem: str) -> list[tuple[str, bytes]]:
    """(figure name or cell index, PNG bytes) of every image a chapter's code cells store."""
    notebook = json.loads((CHAPTERS / f"{stem}.ipynb").read_text(encoding="utf-8"))
    figures = []
    for index, cell in enumerate(notebook["cells"]):
        name = cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name", f"cell {index}")
        for output in cell.get("outputs", []):
            if "image/png" in output.get("data", {}):
                figures.append((name, base64.b64decode(output["data"]["image/png"])))
    return figures


@pytest.mark.parametrize("stem", FIT_A_PHONE)
def test_stored_figures_fit_a_phone_at_print_size(stem):
    figures = stored_figures(stem)
    assert figures, f"{stem} stores no figure"
    too_wide = {name: round(print_width_css_px(png)) for name, png in figures
                if print_width_css_px(png) > PHONE_FIGURE_PX}
    assert not too_wide, (f"{stem}: figures wider than a 390 px phone's {PHONE_FIGURE_PX} px column at print size, "
                          f"in CSS px (draw them at most 4.8 inches wide at 150 dpi): {too_wide}")


def test_a_wide_figure_is_caught():
    """The check reads the PNG itself: a 6.4-inch figure at 150 dpi (as the other chapters draw) is too wide."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = {}
    for inches in (6.4, 4.8):
        fig = plt.figure(figsize=(inches, 2), dpi=150)
        fig.add_subplot().plot([0, 1], [0, 1])
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")  # as the inline backend stores it
        plt.close(fig)
        sizes[inches] = print_width_css_px(buffer.getvalue())
    assert sizes[6.4] > PHONE_FIGURE_PX >= sizes[4.8], sizes
    with pytest.raises(ValueError, match="not a PNG"):
        png_width_and_dpi(b"GIF89a" + bytes(30))


@pytest.mark.book
@pytest.mark.browser
@pytest.mark.parametrize("stem", FIT_A_PHONE)
def test_figures_are_shown_whole_on_a_phone(browser, built_book, stem):
    from browser import serve_directory, watch

    with serve_directory(built_book) as base_url:
        context = browser.new_context(**PHONE)
        problems = watch(context)
        page = context.new_page()
        page.goto(base_url + f"chapters/{stem}.html", timeout=TIMEOUT_MS)
        page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
        page.wait_for_function("() => [...document.querySelectorAll('.bd-article figure img')]"
                               ".every((img) => img.complete && img.naturalWidth > 0)", timeout=TIMEOUT_MS)
        figures = page.evaluate("""() => [...document.querySelectorAll('.bd-article figure')].map((figure) => {
            const img = figure.querySelector('img');
            const box = img.getBoundingClientRect();
            const pad = getComputedStyle(img.parentElement);  // the figure's padding is no room for the image
            const column = img.parentElement.clientWidth - parseFloat(pad.paddingLeft) - parseFloat(pad.paddingRight);
            return {id: figure.id, natural: img.naturalWidth, left: box.left, right: box.right, shown: box.width,
                    column, scrolls: img.closest('.dl-figure-scroll') !== null};
        })""")
        if figures:
            page.locator(f"figure#{SHOWN.get(stem, figures[0]['id'])}").scroll_into_view_if_needed()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / f"phone-figures-{stem}-390.png"))
        context.close()
    assert figures, f"{stem}.html shows no figure"
    stored = dict(stored_figures(stem))
    for figure in figures:
        assert not figure["scrolls"], f"{figure['id']} is in a box that scrolls sideways: {figure}"
        assert figure["left"] >= 0 and figure["right"] <= PHONE["viewport"]["width"], figure
        assert figure["column"] == PHONE_FIGURE_PX, f"the figure column is {figure['column']} px now: {figure}"
        png = stored[figure["id"]]
        assert figure["natural"] == png_width_and_dpi(png)[0], figure
        assert figure["shown"] >= print_width_css_px(png) - 0.5, f"{figure['id']} is drawn below print size: {figure}"
    assert not problems.summary(), problems.summary()
