"""The book builds with no warning, works offline in a real browser, and its Chinese search finds words.

The build runs once per session (`jupyter-book build . -W -n --keep-going --all`, after
scripts/fetch_offline_assets.sh); the browser tests open every page of _toc.yml in Debian's Chromium from a local
server, fail on anything that would break with the network cut off, and keep a screenshot of each page under
_build/screenshots/book-<page>-<width>.png (1366 px and 390 px) for people to look at.
"""
from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from bs4 import BeautifulSoup

from browser import launch_chromium, require_chromium, serve_directory, watch

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
PAGE_TIMEOUT_MS = 30_000
# LaTeX that MathJax should have replaced: display/inline delimiters, or a TeX command right after a dollar sign.
RAW_LATEX = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\(?:frac|sum|begin|end|mathrm|text|left|right|log|exp)\b"
                       r"|\$[^$\n]{0,40}\\[A-Za-z]+")
HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

pytestmark = pytest.mark.book


def toc_pages() -> list[str]:
    """Document names in reading order (root first), as _toc.yml lists them."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        pages += [chapter["file"] for chapter in part["chapters"]]
    return [str(Path(page).with_suffix("")) if Path(page).suffix in {".md", ".ipynb"} else page for page in pages]


def page_label(docname: str) -> str:
    return Path(docname).name


def load_search_index(html: Path) -> dict:
    text = (html / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1: text.rindex(")")])


def test_every_toc_page_is_built(built_book):
    missing = [page for page in toc_pages() if not (built_book / f"{page}.html").is_file()]
    assert not missing, f"pages listed in _toc.yml but not built: {missing}"


def test_search_index_holds_chinese_words(built_book):
    index = load_search_index(built_book)
    chinese = {term for term in [*index["terms"], *index["titleterms"]] if HAN.search(term)}
    # jieba cuts 解码参数怎么选 (a title fixed by the course outline) into words; without jieba there are none.
    assert {"解码", "参数"} <= chinese, f"Chinese words missing from the search index (is jieba installed?): {sorted(chinese)[:40]}"
    assert all(len(term) > 1 for term in chinese)


def chapter_soups(built_book: Path) -> dict[str, BeautifulSoup]:
    """The parsed HTML of each numbered chapter (every page of _toc.yml but the root), by docname."""
    return {page: BeautifulSoup((built_book / f"{page}.html").read_text(encoding="utf-8"), "html.parser")
            for page in toc_pages()[1:]}


def test_chapters_sections_equations_and_exercises_are_numbered(built_book):
    problems = []
    for number, (page, soup) in enumerate(chapter_soups(built_book).items(), start=1):
        title = soup.select_one("main h1 .section-number")
        if title is None or title.get_text(strip=True) != f"{number}.":
            problems.append(f"{page}: title number {title and title.get_text(strip=True)!r}, expected '{number}.'")
        sections = [h.get_text(strip=True) for h in soup.select("main h2 .section-number")]
        if not sections or any(not text.startswith(f"{number}.") for text in sections):
            problems.append(f"{page}: section numbers {sections[:4]}")
        # each number is followed by its permalink (#)
        equations = [eqno.find(string=True, recursive=False).strip() for eqno in soup.select("main .math .eqno")]
        if equations != [f"({number}.{k})" for k in range(1, len(equations) + 1)]:
            problems.append(f"{page}: equation numbers {equations}")
        exercises = [c.get_text(strip=True) for c in soup.select("main .exercise .caption-number")]
        if any(text != f"练习 {number}.{k}" for k, text in enumerate(exercises, start=1)):
            problems.append(f"{page}: exercise numbers {exercises}")
    assert not problems, "\n".join(problems)


def test_figures_are_numbered_and_references_show_the_numbers_of_their_targets(built_book):
    """Every figure of a chapter is a numbered <figure> (图 3.1, 图 3.2, ...) with a caption and alt text, and every
    {numref}/{eq} reference in the book shows the number that its figure or equation displays."""
    problems = []
    numbers: dict[str, str] = {}  # "chapters/03-strategies.html#fig-x" -> "图 3.1" / "(3.2)"
    soups = chapter_soups(built_book)
    for number, (page, soup) in enumerate(soups.items(), start=1):
        main = soup.select_one("main")
        figures = main.select("figure")
        shown = [figure.select_one(".caption-number") for figure in figures]
        shown = [tag.get_text(strip=True) if tag else None for tag in shown]
        if shown != [f"图 {number}.{k}" for k in range(1, len(figures) + 1)]:
            problems.append(f"{page}: figure numbers {shown}")
        for figure, label in zip(figures, shown):
            image = figure.select_one("img")
            if not figure.get("id") or image is None or not image.get("alt", "").strip():
                problems.append(f"{page}: figure {label} has no id, image or alt text")
            numbers[f"{page}.html#{figure.get('id')}"] = label
        loose = [img for img in main.select(".cell_output img") if img.find_parent("figure") is None]
        if loose:
            problems.append(f"{page}: {len(loose)} output images are not numbered figures (add mystnb.figure metadata)")
        for eqno in main.select(".math .eqno"):
            numbers[f"{page}.html#{eqno.parent.get('id')}"] = eqno.find(string=True, recursive=False).strip()
    references = 0
    for page, soup in soups.items():
        for link in soup.select("main a.reference.internal[href*='#']"):
            path, _, fragment = link["href"].partition("#")
            target = posixpath.normpath(f"{Path(page).parent.as_posix()}/{path}") if path else f"{page}.html"
            key = f"{target}#{fragment}"
            if key in numbers:
                references += 1
                if link.get_text(strip=True) != numbers[key]:
                    problems.append(f"{page}: a reference to {key} says {link.get_text(strip=True)!r}, "
                                    f"the target shows {numbers[key]!r}")
    assert references > 20, f"only {references} references to numbered figures and equations"
    assert not problems, "\n".join(problems)


def test_every_solution_is_a_dropdown_with_nothing_after_it(built_book):
    """An answer sits inside its solution dropdown: after a solution comes the next exercise or the section's end,
    never a paragraph that a reader would see without opening the dropdown (chapter 07 had two)."""
    problems = []
    for page, soup in chapter_soups(built_book).items():
        for solution in soup.select("main div.solution"):
            if "dropdown" not in solution.get("class", []):
                problems.append(f"{page}: solution {solution.get('id')} is not a dropdown")
            after = solution.find_next_sibling()
            if after is not None and "exercise" not in after.get("class", []):
                problems.append(f"{page}: after solution {solution.get('id')} comes visible "
                                f"<{after.name}>: {after.get_text(strip=True)[:60]!r}")
    assert not problems, "\n".join(problems)


def test_every_page_has_a_favicon_and_the_licence(built_book):
    problems = []
    for page in toc_pages():
        soup = BeautifulSoup((built_book / f"{page}.html").read_text(encoding="utf-8"), "html.parser")
        icon = soup.select_one('link[rel="icon"]')
        if icon is None or not (built_book / page).parent.joinpath(icon["href"]).resolve().is_file():
            problems.append(f"{page}: no favicon ({icon})")
        footer = soup.select_one("footer.bd-footer-content")
        if footer is None or "MIT 许可" not in footer.get_text():
            problems.append(f"{page}: the footer does not name the licence")
    assert not problems, "\n".join(problems)


# A line break a browser would show as a space where Chinese typesetting has none (book/cjk_text.py removes them):
# between two CJK characters, or next to full-width punctuation. \x00 stands for code and math.
CJK_CHAR = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"
FULL_WIDTH_PUNCTUATION = "\u3000-\u303f\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
STRAY_BREAK = re.compile(f"[{CJK_CHAR}]\\s*\\n\\s*[{CJK_CHAR}]|[{FULL_WIDTH_PUNCTUATION}]\\s*\\n|\\n\\s*[{FULL_WIDTH_PUNCTUATION}]")
CLOSING_PUNCTUATION = "，。、；：？！）》」』”’"


def test_chinese_prose_has_no_stray_gaps(built_book):
    """No line break of the Markdown source shows as a space inside Chinese text, and no inline math can be
    separated from the closing punctuation after it (which would then start a line)."""
    problems = []
    for page in toc_pages():
        soup = BeautifulSoup((built_book / f"{page}.html").read_text(encoding="utf-8"), "html.parser")
        main = soup.select_one("main")
        for math in main.select("p span.math"):
            after = math.next_sibling
            if (isinstance(after, str) and after[:1] in CLOSING_PUNCTUATION
                    and "dl-nowrap" not in math.parent.get("class", [])):
                problems.append(f"{page}: math {math.get_text()[:30]!r} may be split from the {after[:1]!r} after it")
        for opaque in main.select("pre, code, script, .math, .cell_output"):
            opaque.replace_with("\x00")
        for block in main.select("p, dt, h1, h2, h3, caption"):
            text = block.get_text()
            problems += [f"{page}: a line break shows as a space in {text[max(0, m.start() - 10):m.end() + 10]!r}"
                         for m in STRAY_BREAK.finditer(text)]
    assert not problems, f"{len(problems)} stray gaps:\n" + "\n".join(problems[:20])


def test_offline_assets_are_served(built_book):
    for name in ("mathjax/tex-mml-chtml.js", "requirejs/require.js", "widgets/embed-amd.js",
                 "widgets-require-config.js", "widgets-mathjax-shim.js", "anywidget/index.js",
                 "zh-search.js"):
        assert (built_book / "_static" / name).is_file(), (
            f"_static/{name} missing from the build: run scripts/fetch_offline_assets.sh (needs npm), then rebuild")


@pytest.fixture(scope="module")
def browser_session(built_book):
    require_chromium()
    from playwright.sync_api import sync_playwright

    with serve_directory(built_book) as base_url, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser, base_url
        finally:
            browser.close()


WIDGETS_RENDERED_JS = """() => [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')]
  .every((view) => { const area = view.previousElementSibling;
                     return area && area.classList.contains('widget-subarea') && area.childElementCount > 0; })"""


def unrendered_widgets(page) -> str | None:
    """None when every widget view stored in the page has been drawn by the embed manager, else a description."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    if views == 0:
        return None
    try:
        page.wait_for_function(WIDGETS_RENDERED_JS, timeout=PAGE_TIMEOUT_MS)
    except PlaywrightTimeout:
        return f"widgets not drawn from their stored state within {PAGE_TIMEOUT_MS} ms ({views} views on the page)"
    return None


def wait_for_mathjax(page) -> None:
    page.evaluate("""() => (window.MathJax && MathJax.startup && MathJax.startup.promise)
                           ? MathJax.startup.promise.then(() => true) : true""")


MATH_STATE_JS = """() => {
  const main = document.querySelector('main') || document.body;
  const maths = [...main.querySelectorAll('.math')];
  const clone = main.cloneNode(true);
  clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach((el) => el.remove());
  return {
    maths: maths.length,
    unrendered: maths.filter((el) => !el.querySelector('mjx-container')).map((el) => el.textContent.slice(0, 80)),
    mathjaxErrors: main.querySelectorAll('mjx-merror').length,
    // CHTML draws each character as <mjx-c class="mjx-cHEX">; a backslash (5C) inside text means a TeX escape
    // such as an escaped underscore in text mode, which MathJax prints literally.
    literalEscapes: [...main.querySelectorAll('mjx-mtext')].filter((el) => el.querySelector('mjx-c.mjx-c5C')).length,
    text: clone.textContent,
    heading: (main.querySelector('h1') || {textContent: ''}).textContent,
    next: (document.querySelector('a.right-next') || {href: null}).href,
  };
}"""


# What a reader cannot see in full: a page wider than the window, content a box cuts off (an exercise box, a formula,
# a column of widget controls), and a box that scrolls sideways without the cue of book/static/scroll-cues.js.
LAYOUT_PROBLEMS_JS = """() => {
  const SLACK = 2;
  const problems = [];
  const describe = (el) => `<${el.tagName.toLowerCase()}${typeof el.className === "string" && el.className.trim()
    ? "." + el.className.trim().split(/\\s+/).slice(0, 3).join(".") : ""}> «${(el.textContent || "").trim().slice(0, 40)}»`;
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    problems.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} px wide`);
  }
  const article = document.querySelector("article.bd-article");
  // MathJax's and the widgets' insides manage their own overflow; their boxes are checked from outside
  const inside = (el) => el.closest("mjx-container, .widget-subarea, .jupyter-widgets, .dl-explorer");
  for (const el of article.querySelectorAll("*")) {
    if (el.clientWidth === 0 || inside(el)) continue;
    if (el.matches("span.math")) {  // the theme clips inline math; its scrollWidth counts hidden MathML
      const drawn = el.querySelector("mjx-math");
      if (drawn && drawn.getBoundingClientRect().width > el.clientWidth + SLACK && !el.classList.contains("dl-scrolls")) {
        problems.push(`formula cut off: ${describe(el)}`);
      }
      continue;
    }
    const more = el.scrollWidth - el.clientWidth;
    if (more <= SLACK) continue;
    const overflow = getComputedStyle(el).overflowX;
    if (overflow === "hidden" || overflow === "clip") {
      problems.push(`${more} px cut off by ${describe(el)}`);
    } else if ((overflow === "auto" || overflow === "scroll") && !el.classList.contains("dl-scrolls")) {
      problems.push(`scrolls sideways without a cue: ${describe(el)}`);
    }
  }
  for (const column of article.querySelectorAll(".widget-hbox > *, .jupyter-widget-hbox > *")) {
    if (column.clientWidth > 0 && column.scrollWidth > column.clientWidth + SLACK) {
      problems.push(`widget column cut off: ${describe(column)}`);
    }
  }
  return problems;
}"""
VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}


@pytest.mark.browser
@pytest.mark.parametrize("device", VIEWPORTS)
def test_every_page_renders_offline(browser_session, device):
    """Every page at 1366 px and at 390 px: no request fails or leaves the machine, math and widgets are drawn,
    nothing is cut off, and a screenshot is kept as _build/screenshots/book-<page>-<width>.png."""
    browser, base_url = browser_session
    viewport = VIEWPORTS[device]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport=viewport, locale="zh-CN")
    problems = watch(context)
    page = context.new_page()
    pages = toc_pages()
    failures = []
    for position, docname in enumerate(pages):
        problems.clear()
        page.goto(base_url + f"{docname}.html", wait_until="load", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_MS)
        wait_for_mathjax(page)
        widgets = unrendered_widgets(page)
        page.wait_for_timeout(500)  # scroll-cues.js looks again 100 ms after MathJax and the widgets change the page
        state = page.evaluate(MATH_STATE_JS)
        layout = page.evaluate(LAYOUT_PROBLEMS_JS)  # before the screenshot, which resizes the window for a moment
        page.screenshot(path=str(SCREENSHOTS / f"book-{page_label(docname)}-{viewport['width']}.png"), full_page=True)
        found = problems.summary().splitlines() + ([widgets] if widgets else []) + layout
        if state["unrendered"]:
            found.append(f"{len(state['unrendered'])} of {state['maths']} math elements not rendered by MathJax: "
                         f"{state['unrendered'][:3]}")
        if state["mathjaxErrors"]:
            found.append(f"{state['mathjaxErrors']} MathJax errors (mjx-merror)")
        if state["literalEscapes"]:
            found.append(f"{state['literalEscapes']} math text runs print a literal backslash (a TeX escape in text mode)")
        raw = sorted({match.group(0) for match in RAW_LATEX.finditer(state["text"])})
        if raw:
            found.append(f"raw LaTeX in the rendered text: {raw[:5]}")
        if not HAN.search(state["heading"] + state["text"]):
            found.append("no Chinese text on the page")
        expected_next = base_url + f"{pages[position + 1]}.html" if position + 1 < len(pages) else None
        if state["next"] != expected_next:
            found.append(f"'next' link goes to {state['next']}, expected {expected_next}")
        failures += [f"{docname} at {viewport['width']} px: {line}" for line in found]
    context.close()
    assert not failures, "\n".join(failures)


@pytest.mark.browser
def test_next_link_navigates(browser_session):
    browser, base_url = browser_session
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems = watch(context)
    page = context.new_page()
    first, second = toc_pages()[:2]
    page.goto(base_url + "index.html", timeout=PAGE_TIMEOUT_MS)  # the redirect to the root page
    page.wait_for_url(f"**/{first}.html", timeout=PAGE_TIMEOUT_MS)
    page.locator("a.right-next").first.click()
    page.wait_for_url(f"**/{second}.html", timeout=PAGE_TIMEOUT_MS)
    heading = page.locator("main h1").first.text_content()
    context.close()
    assert heading and heading.strip(), f"{second}.html has no heading"
    assert not problems.summary(), problems.summary()


def search_result_pages(page, base_url: str, query: str) -> list[str]:
    """Docnames that the book's search page lists for `query`, in the order shown."""
    page.goto(base_url + f"search.html?q={quote(query)}", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(
        "() => { const s = document.querySelector('#search-results .search-summary');"
        " return s && s.textContent.trim().length > 0; }", timeout=PAGE_TIMEOUT_MS)
    hrefs = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map((a) => a.href)")
    if hrefs:  # the page fetches every found page for its snippet; leaving before they arrive aborts those requests
        page.wait_for_function(SNIPPETS_DONE_JS, timeout=PAGE_TIMEOUT_MS)
    return [href.removeprefix(base_url).split("?")[0].split("#")[0].removesuffix(".html") for href in hrefs]


def greedy_split(text: str, terms: set[str]) -> list[str]:
    """The split that book/static/zh-search.js makes of a run of Han characters (longest index term first)."""
    longest = max(map(len, terms))
    words, start = [], 0
    while start < len(text):
        end = min(len(text), start + longest)
        while end > start + 1 and text[start:end] not in terms:
            end -= 1
        if end > start + 1:
            words.append(text[start:end])
        start = end if end > start + 1 else start + 1
    return words


def unsegmented_query(index: dict) -> tuple[str, str]:
    """A query such as "温度越低": two Chinese words of one page written together. Sphinx alone finds nothing for
    it: it is no index term, no part of any term or title. Returns (query, docname of a page holding both words).
    Chosen from the built index, so that the test follows the pages as they are written."""
    docs_of: dict[str, set[int]] = {}
    for table in (index["terms"], index["titleterms"]):
        for term, docs in table.items():
            docs_of.setdefault(term, set()).update(docs if isinstance(docs, list) else [docs])
    known = set(docs_of)
    titles = [title.lower() for title in [*index["titles"], *index["alltitles"]]]
    chinese = sorted(term for term in known if HAN.fullmatch(term[0]) and all(HAN.fullmatch(c) for c in term))
    for doc, docname in enumerate(index["docnames"]):
        words = [term for term in chinese if doc in docs_of[term]]
        for first in words:
            for second in words:
                query = first + second
                if (first != second and greedy_split(query, known) == [first, second]
                        and not any(query in term for term in known)
                        and not any(query in title for title in titles)):
                    return query, docname
    raise AssertionError("no two Chinese words of one page make a query that needs segmenting")


@pytest.mark.browser
def test_chinese_search_segments_the_query(browser_session):
    browser, base_url = browser_session
    query, expected = unsegmented_query(load_search_index(HTML))

    context = browser.new_context()
    problems = watch(context)
    found = search_result_pages(context.new_page(), base_url, query)
    context.close()
    assert not problems.summary(), problems.summary()
    assert expected in found, f"search for {query!r} found {found}, not {expected}"

    # The same search without book/static/zh-search.js finds nothing: the script is what makes it work.
    plain = browser.new_context()
    plain.route(lambda url: "/_static/zh-search.js" in url,
                lambda route: route.fulfill(status=200, content_type="text/javascript", body="// disabled"))
    found_without = search_result_pages(plain.new_page(), base_url, query)
    plain.close()
    assert found_without == [], f"search for {query!r} found {found_without} even without the query splitter"


VISIBLE_SEARCH_FIELDS_JS = """() => [...document.querySelectorAll('.search-button-field, form.bd-search')]
  .filter((el) => !el.closest('dialog') && el.getBoundingClientRect().width > 0 && getComputedStyle(el).visibility === 'visible')
  .length"""


@pytest.mark.browser
def test_phone_reader_opens_the_chapter_list_and_follows_a_link(browser_session):
    """At 390 px the sidebars are hidden; the article header's ☰ opens the chapter list, a link in it leads to another
    chapter, and there the page-contents button lists the page's sections."""
    browser, base_url = browser_session
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    problems = watch(context)
    page = context.new_page()
    first, target = toc_pages()[1], toc_pages()[-4]
    page.goto(base_url + f"{first}.html", timeout=PAGE_TIMEOUT_MS)
    chapter_list = page.locator("#pst-primary-sidebar-modal")
    target_link = chapter_list.locator(f'a[href="{Path(target).name}.html"]')
    assert not page.locator(f'#pst-primary-sidebar a[href="{Path(target).name}.html"]').is_visible()

    page.locator(".bd-header-article .primary-toggle").tap()
    target_link.wait_for(state="visible", timeout=PAGE_TIMEOUT_MS)
    assert chapter_list.evaluate("(dialog) => dialog.open")
    target_link.tap()
    page.wait_for_url(f"**/{target}.html", timeout=PAGE_TIMEOUT_MS)

    page.locator(".bd-header-article .secondary-toggle").tap()
    contents = page.locator("#pst-secondary-sidebar-modal nav.page-toc a")
    contents.first.wait_for(state="visible", timeout=PAGE_TIMEOUT_MS)
    headings = page.locator("main section h2").count()
    assert contents.count() >= headings > 0, f"page contents list {contents.count()} links for {headings} sections"
    context.close()
    assert not problems.summary(), problems.summary()


@pytest.mark.browser
def test_desktop_toggle_collapses_the_sidebar_and_one_search_field_shows(browser_session):
    browser, base_url = browser_session
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    problems = watch(context)
    page = context.new_page()
    page.goto(base_url + f"{toc_pages()[1]}.html", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_MS)
    sidebar_link = page.locator("#pst-primary-sidebar nav.bd-docs-nav a").first
    assert sidebar_link.is_visible()
    assert page.evaluate(VISIBLE_SEARCH_FIELDS_JS) == 1

    toggle = page.locator(".bd-header-article .primary-toggle")
    toggle.click()
    sidebar_link.wait_for(state="hidden", timeout=PAGE_TIMEOUT_MS)
    toggle.click()
    sidebar_link.wait_for(state="visible", timeout=PAGE_TIMEOUT_MS)
    context.close()
    assert not problems.summary(), problems.summary()


def glossary_entries(built_book: Path) -> list[list[str]]:
    """The names of each entry of the built glossary (the <dt>s before one <dd>), e.g. ["exposure bias", "曝光偏差"]."""
    soup = BeautifulSoup((built_book / "chapters" / "09-glossary.html").read_text(encoding="utf-8"), "html.parser")
    entries = []
    for glossary in soup.select("dl.glossary"):
        names = []
        for child in glossary.find_all(["dt", "dd"], recursive=False):
            if child.name == "dt":
                names.append(child.get_text().replace("#", "").strip())
            else:
                entries.append(names)
                names = []
    return entries


def test_chinese_glossary_names_find_the_pages_of_their_english_terms(built_book):
    """Each Chinese name of a glossary entry is an index word listing every page that writes the entry's English
    name: 曝光偏差 finds the chapters that say "exposure bias"."""
    index = load_search_index(built_book)
    texts = {page: BeautifulSoup((built_book / f"{page}.html").read_text(encoding="utf-8"), "html.parser")
             .select_one("article.bd-article").get_text().lower() for page in toc_pages()}
    problems = []
    entries = glossary_entries(built_book)
    assert any("曝光偏差" in names for names in entries), entries[:5]
    for names in entries:
        english = [name for name in names if not HAN.search(name)]
        for chinese in (name for name in names if re.fullmatch(r"[\u3400-\u9fff]{2,}", name)):
            found = index["terms"].get(chinese, [])
            found = {index["docnames"][n] for n in (found if isinstance(found, list) else [found])}
            users = {page for page, text in texts.items()
                     if any(re.search(rf"(?<![a-z0-9_]){re.escape(name.lower())}(?![a-z0-9_])", text) for name in english)}
            if users - found:
                problems.append(f"{chinese} ({', '.join(english)}): the index misses {sorted(users - found)}")
    assert not problems, "\n".join(problems)


SNIPPETS_DONE_JS = """() => { const items = document.querySelectorAll('#search-results ul.search li');
  return items.length > 0 && [...items].every((li) => li.querySelector('p.context')); }"""


@pytest.mark.browser
def test_search_finds_english_terms_by_their_chinese_name_and_snippets_are_plain_text(browser_session):
    browser, base_url = browser_session
    context = browser.new_context()
    problems = watch(context)
    page = context.new_page()
    found = search_result_pages(page, base_url, "曝光偏差")
    assert "chapters/05-exposure-bias" in found, f"search for 曝光偏差 found {found}"

    found = search_result_pages(page, base_url, "softmax")  # pages full of math
    snippets = page.eval_on_selector_all("#search-results ul.search li p.context", "ps => ps.map((p) => p.textContent)")
    context.close()
    assert len(snippets) == len(found) > 3
    raw = [(snippet[:80], sorted({m.group(0) for m in RAW_LATEX.finditer(snippet)})) for snippet in snippets
           if RAW_LATEX.search(snippet) or "\\" in snippet]
    assert not raw, f"search snippets with TeX source: {raw}"
    assert not problems.summary(), problems.summary()
