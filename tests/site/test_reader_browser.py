"""The built book as a reader meets it, in Debian's Chromium: Chinese search that ranks the teaching chapter first,
printing, and a 390 px phone (book/zh_search.py, book/reader_fixes.py, book/static/reader.*, zh-search.js).

- Search: a glossary name finds the glossary entry, then the chapter that teaches it (曝光偏差 → 05, 束搜索 /
  贪心解码 / 核采样 → 03, 温度 → 02); each snippet starts where a name of the entry matched and marks it.
- Print (A4, printable width 182 mm = 688 CSS px): no code block of chapters 02 and 03 is cut at the margin; the
  header's print button says "打印成 PDF".
- Phone (390 × 844, touch): chapter 08's three tables are one card per row with every column on screen, each cell
  under its column's name; chapter 03's figures draw a 10-pt label at 10 CSS px or more (the PNGs are 150 dpi) and
  open full size on a tap, offline; ␃ is drawn as a boxed EOS; the header buttons have Chinese titles and no tooltip
  is shown after a tap; the page-contents drawer closes after a tap on one of its links.
Screenshots: _build/screenshots/reader-*.png."""
from __future__ import annotations

import re
import struct
from pathlib import Path
from urllib.parse import quote

import pytest

from browser import serve_directory, watch

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots"
TIMEOUT_MS = 30_000
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True,
         "locale": "zh-CN"}
A4_PRINTABLE_PX = 688  # 210 mm - 2 × 14 mm of reader.css's @page margins, at 96 CSS px per inch
SEARCHES = {  # query -> the chapter that teaches it, first after the glossary
    "曝光偏差": "chapters/05-exposure-bias",
    "束搜索": "chapters/03-strategies",
    "贪心解码": "chapters/03-strategies",
    "核采样": "chapters/03-strategies",
    "温度": "chapters/02-temperature",
}
GLOSSARY = "chapters/09-glossary"
FIGURE_DPI = 150
SNIPPETS_DONE_JS = ("() => [...document.querySelectorAll('#search-results ul.search li')]"
                    ".every((li) => li.querySelector('p.context') !== null || li.dataset.done === '1')")

pytestmark = [pytest.mark.book, pytest.mark.browser]


@pytest.fixture(scope="module")
def site(built_book):
    with serve_directory(built_book) as base_url:
        yield built_book, base_url


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"reader-{name}.png"))


def _open(page, url: str) -> None:
    page.goto(url, timeout=TIMEOUT_MS)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)


def _results(page, base_url: str, query: str) -> list[dict]:
    page.goto(base_url + f"search.html?q={quote(query)}", timeout=TIMEOUT_MS)
    page.wait_for_function("() => { const s = document.querySelector('#search-results .search-summary');"
                           " return s && s.textContent.trim().length > 0; }", timeout=TIMEOUT_MS)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)  # each result's page is fetched for its snippet
    return page.eval_on_selector_all("#search-results ul.search li", """items => items.map((li) => ({
        href: li.querySelector('a').getAttribute('href'),
        snippet: (li.querySelector('p.context') || {}).textContent || '',
        marked: [...li.querySelectorAll('p.context .highlighted')].map((m) => m.textContent),
    }))""")


def _docname(href: str) -> str:
    return href.split("?")[0].split("#")[0].removesuffix(".html")


def test_search_ranks_the_teaching_chapter_first_and_snippets_show_the_match(browser, site):
    _, base_url = site
    context = browser.new_context(viewport={"width": 1366, "height": 900}, locale="zh-CN")
    problems = watch(context)
    page = context.new_page()
    orders = {}
    for query, teacher in SEARCHES.items():
        results = _results(page, base_url, query)
        pages = [_docname(result["href"]) for result in results]
        # the glossary (its entry, its page) may come first; the first other page must be the teaching chapter
        first_other = next(name for name in pages if name != GLOSSARY)
        orders[query] = pages[:4]
        assert first_other == teacher, f"{query}: {pages[:5]}"
        teaching = next(result for result in results if _docname(result["href"]) == teacher)
        assert teaching["marked"], f"{query}: the snippet of {teacher} marks nothing: {teaching['snippet'][:120]}"
    _shot(page, "search-1366")
    context.close()
    assert not problems.summary(), problems.summary()


def test_print_wraps_code_and_the_button_says_print_in_simplified_chinese(browser, site):
    built, base_url = site
    page = browser.new_page(viewport={"width": A4_PRINTABLE_PX, "height": 1000})
    problems = watch(page)
    cut = {}
    for chapter in ("02-temperature", "03-strategies"):
        _open(page, base_url + f"chapters/{chapter}.html")
        page.emulate_media(media="print")
        shown, overflowing = page.evaluate("""() => {
            const boxes = [...document.querySelectorAll('.bd-article pre')].filter((p) => p.offsetParent !== null);
            return [boxes.length, boxes.filter((p) => p.scrollWidth > p.clientWidth + 1).length]; }""")
        assert shown > 10, (chapter, shown)
        cut[chapter] = overflowing
        assert page.pdf(format="A4")[:4] == b"%PDF"
        page.emulate_media(media="screen")
    page.close()
    assert cut == {"02-temperature": 0, "03-strategies": 0}, f"code blocks cut at the A4 margin: {cut}"
    html = (built / "chapters" / "02-temperature.html").read_text("utf-8")
    assert "打印成 PDF" in html and "列印" not in html
    assert not problems.summary(), problems.summary()


@pytest.fixture()
def phone(browser):
    context = browser.new_context(**PHONE)
    context.set_default_timeout(TIMEOUT_MS)
    problems = watch(context)
    page = context.new_page()
    yield page
    context.close()
    assert not problems.summary(), problems.summary()


def test_phone_tables_keep_every_column_on_screen(phone, site):
    _, base_url = site
    _open(phone, base_url + "chapters/08-choosing-parameters.html")
    tables = phone.evaluate("""() => [...document.querySelectorAll('.bd-article table')].map((table) => ({
        cards: table.classList.contains('dl-cards'),
        heads: [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim()),
        cells: [...table.querySelectorAll('tbody td')].map((td) => {
            const r = td.getBoundingClientRect();
            return {label: td.dataset.label, left: r.left, right: r.right, width: r.width, text: td.textContent.trim()};
        }),
    }))""")
    assert len(tables) == 3, len(tables)
    heads = [table["heads"] for table in tables]
    assert ["任务", "起点", "为什么"] in heads and ["症状", "常见原因", "先试什么", "回看"] in heads, heads
    for table in tables:
        assert table["cards"], table["heads"]
        for cell in table["cells"]:
            assert cell["label"] in table["heads"], cell
            # every cell of every column inside the 390 px screen, at least 300 px wide (not a 104 px column)
            assert cell["left"] >= 0 and cell["right"] <= 390 and cell["width"] >= 300, (table["heads"], cell)
    symptoms = next(table for table in tables if "回看" in table["heads"])
    assert all(cell["text"] for cell in symptoms["cells"] if cell["label"] in ("回看", "先试什么"))
    phone.locator("table.dl-cards").last.scroll_into_view_if_needed()
    _shot(phone, "ch08-symptoms-390")


def _png_dpi(path: Path) -> float:
    data = path.read_bytes()
    at = data.find(b"pHYs")
    assert at > 0, f"{path.name} has no pHYs chunk"
    per_metre_x, _, unit = struct.unpack(">IIB", data[at + 4:at + 13])
    assert unit == 1, path.name
    return per_metre_x * 0.0254


def test_phone_figures_are_readable_and_open_full_size_on_a_tap(phone, site):
    built, base_url = site
    _open(phone, base_url + "chapters/03-strategies.html")
    figures = phone.evaluate("""() => [...document.querySelectorAll('.bd-article img.dl-zoomable')].map((img) => ({
        src: img.getAttribute('src'), natural: img.naturalWidth, shown: img.getBoundingClientRect().width }))""")
    assert len(figures) >= 3, figures
    for figure in figures:
        dpi = _png_dpi((built / "chapters" / figure["src"]).resolve())
        assert round(dpi) == FIGURE_DPI, (figure["src"], dpi)
        label_px = 10 / 72 * dpi * figure["shown"] / figure["natural"]  # a 10-pt label, in CSS px
        assert label_px >= 10 - 0.05, (figure, round(label_px, 2))
    first = phone.locator("img.dl-zoomable").first
    first.scroll_into_view_if_needed()
    _shot(phone, "ch03-figure-390")
    first.tap()
    zoom = phone.locator(".dl-zoom")
    zoom.wait_for()
    assert zoom.locator("img").evaluate("(img) => img.getBoundingClientRect().width") == figures[0]["natural"]
    _shot(phone, "ch03-figure-enlarged-390")
    zoom.tap()
    zoom.wait_for(state="detached")


def test_phone_eos_mark_titles_and_the_contents_drawer(phone, site):
    _, base_url = site
    _open(phone, base_url + "chapters/02-temperature.html")
    phone.locator(".bd-article .dl-eos").first.wait_for(state="attached")  # the EOS marks are drawn after the load
    article = phone.locator(".bd-article")
    assert "\u2403" not in article.inner_text()
    assert phone.locator(".bd-article .dl-eos").count() >= 1
    english = phone.evaluate("""() => [...document.querySelectorAll('.bd-header-article [title], .bd-header [title],'
        + ' .bd-header-article [aria-label], .bd-header [aria-label]')]
        .map((el) => el.getAttribute('title') || el.getAttribute('aria-label'))
        .filter((text) => /^(Toggle|Color mode|System|Search|Fullscreen|Download|Print)/.test(text))""")
    assert not english, english
    toggle = phone.locator(".bd-header-article .secondary-toggle").first
    toggle.tap()
    drawer = phone.locator("#pst-secondary-sidebar-modal")
    phone.wait_for_function("() => document.getElementById('pst-secondary-sidebar-modal').open")
    assert phone.locator(".tooltip.show").count() == 0 or not phone.locator(".tooltip.show").first.is_visible()
    _shot(phone, "ch02-contents-drawer-390")
    drawer.locator("a[href^='#']").nth(1).tap()
    phone.wait_for_function("() => !document.getElementById('pst-secondary-sidebar-modal').open")
    _shot(phone, "ch02-after-drawer-390")


def test_desktop_screenshots_of_the_archive_menu_and_the_footer(browser, site):
    _, base_url = site
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    problems = watch(page)
    _open(page, base_url + "chapters/03-strategies.html")
    page.locator(".article-header-buttons .dropdown-download-buttons button, "
                 ".article-header-buttons [aria-label='下载此页面']").first.click()
    course = page.locator(".article-header-buttons a", has_text="课程包 .zip")
    course.wait_for(state="visible")
    _shot(page, "ch03-download-menu-1366")
    page.keyboard.press("Escape")
    page.locator("footer.bd-footer-content").scroll_into_view_if_needed()
    footer = page.locator("footer.bd-footer-content").inner_text()
    assert "CC BY-SA 4.0" in footer and "MIT" in footer and re.search(r"课程包 \.zip", footer)
    _shot(page, "ch03-footer-1366")
    page.close()
    assert not problems.summary(), problems.summary()


def test_local_addresses_are_code_not_links(built_book):
    """The intro's `make api` address (http://127.0.0.1:8000/v1) is shown as code: no page links to a local server."""
    linked = {}
    for page in sorted((built_book / "chapters").glob("*.html")):
        found = re.findall(r'<a [^>]*href="https?://(?:127\.0\.0\.1|localhost)[^"]*"', page.read_text("utf-8"))
        if found:
            linked[page.name] = found[:3]
    assert not linked, linked
    intro = (built_book / "chapters" / "00-intro.html").read_text("utf-8")
    assert "http://127.0.0.1:8000/v1" in intro
