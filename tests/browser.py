"""Shared helpers for the browser tests: Debian's Chromium driven by Playwright, a local static server, and a
watcher that records everything a page must not do (console errors, failed requests, requests to other hosts).

Playwright's own browser download is never used (no `playwright install`): the tests drive `/usr/bin/chromium`,
which `.ci/run` installs from Debian's packages together with a CJK font (fonts-wqy-microhei).
"""
from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = ROOT / "_offline"
REQUIRE_CONFIG = ROOT / "book" / "static" / "widgets-require-config.js"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
LOCAL_SCHEMES = frozenset({"data", "blob", "about"})


def require_chromium() -> Path:
    """The Chromium binary, or a skip that says how to install it (a skip fails the suite under CI=true)."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} not found: run scripts/install-system-deps.sh (Debian's chromium and a CJK font)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the Python package playwright is not installed (pip install -r requirements.txt)")
    return CHROMIUM


def launch_chromium(playwright):
    """Launch Debian's Chromium headless with flags that keep it from calling home."""
    return playwright.chromium.launch(executable_path=str(require_chromium()), args=list(CHROMIUM_ARGS))


@contextmanager
def chromium_browser():
    """Debian's Chromium, launched once for a module's tests and closed after them (or a skip, as require_chromium)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        try:
            yield chromium
        finally:
            chromium.close()


def is_local(url: str) -> bool:
    """True for URLs served from this machine (or inline data), False for anything that would need the network."""
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the signature is the base class's
        pass


@contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """Serve `root` over HTTP on 127.0.0.1 at a free port, in a thread; yields the base URL ending in '/'."""
    if not Path(root).is_dir():
        raise ValueError(f"root must be an existing directory, got {root!s}")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name=f"serve {root}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class PageProblems:
    """What went wrong on a page: filled by `watch`, read by the test."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)

    def clear(self) -> None:
        for problems in (self.console_errors, self.page_errors, self.failed_requests, self.external_requests):
            problems.clear()

    def summary(self) -> str:
        """One line per problem, empty when there is none."""
        lines = [f"console error: {text}" for text in self.console_errors]
        lines += [f"uncaught exception: {text}" for text in self.page_errors]
        lines += [f"failed request: {text}" for text in self.failed_requests]
        lines += [f"request to a non-local host (blocked): {url}" for url in self.external_requests]
        return "\n".join(lines)


def watch(context_or_page) -> PageProblems:
    """Record console errors, uncaught exceptions and failed requests of a page, and block (and record) every
    request to a non-local host. Works on a Playwright BrowserContext (all its pages) or a single Page."""
    problems = PageProblems()

    def block_external(route) -> None:
        problems.external_requests.append(route.request.url)
        route.abort("blockedbyclient")

    def on_page(page) -> None:
        page.on("console", lambda msg: msg.type == "error" and problems.console_errors.append(
            f"{msg.text} ({msg.location.get('url', '?')}:{msg.location.get('lineNumber', '?')})"))
        page.on("pageerror", lambda error: problems.page_errors.append(str(error)))
        page.on("requestfailed", lambda request: is_local(request.url) and problems.failed_requests.append(
            f"{request.url}: {request.failure}"))
        page.on("response", lambda response: response.status >= 400 and problems.failed_requests.append(
            f"{response.url}: HTTP {response.status}"))

    context_or_page.route(lambda url: not is_local(url), block_external)
    if hasattr(context_or_page, "pages"):  # a BrowserContext
        context_or_page.on("page", on_page)
        for page in context_or_page.pages:
            on_page(page)
    else:
        on_page(context_or_page)
    return problems


STANDALONE_PAGE = """<!DOCTYPE html>
<html lang="zh-CN"><head><meta charset="utf-8"><title>{title}</title>
<script src="_static/requirejs/require.js"></script>
<script src="_static/widgets-require-config.js"></script>
<script src="_static/widgets/embed-amd.js"></script>
</head><body>
<script type="application/vnd.jupyter.widget-state+json">{state}</script>
<script type="application/vnd.jupyter.widget-view+json">{view}</script>
</body></html>
"""
WIDGET_STATE_MARKER = '<script type="application/vnd.jupyter.widget-state+json">'


def write_standalone_site(site: Path, widget, title: str) -> None:
    """Lay `site` out like the book's _build/html (require.js, the embed manager, anywidget's loader under
    _static/) and write `site/index.html`, a page that embeds `widget`'s full saved state, as a saved notebook
    holds it. The offline JavaScript comes from scripts/fetch_offline_assets.sh (needs npm the first time)."""
    fetch = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_offline_assets.sh")], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert fetch.returncode == 0 and (OFFLINE / "widgets" / "embed-amd.js").is_file(), (
        f"the offline widget JavaScript is missing (scripts/fetch_offline_assets.sh needs npm):\n{fetch.stderr}")
    import anywidget
    from ipywidgets.embed import embed_data

    static = Path(site) / "_static"
    shutil.copytree(OFFLINE / "requirejs", static / "requirejs")
    shutil.copytree(OFFLINE / "widgets", static / "widgets")
    shutil.copyfile(REQUIRE_CONFIG, static / "widgets-require-config.js")
    (static / "anywidget").mkdir()
    shutil.copyfile(Path(anywidget.__file__).parent / "nbextension" / "index.js", static / "anywidget" / "index.js")
    data = embed_data(views=[widget], drop_defaults=False)
    (Path(site) / "index.html").write_text(
        STANDALONE_PAGE.format(title=title, state=json.dumps(data["manager_state"]),
                               view=json.dumps(data["view_specs"][0])), encoding="utf-8")


def saved_widget_states(html: Path) -> list[dict]:
    """The model states of every widget saved on a built page (its widget-state script)."""
    text = Path(html).read_text(encoding="utf-8")
    start = text.index(WIDGET_STATE_MARKER) + len(WIDGET_STATE_MARKER)
    state = json.loads(text[start:text.index("</script>", start)])
    return [model["state"] for model in state["state"].values()]


@contextmanager
def served_page(browser, root: Path, path: str, *, timeout_ms: int, viewport: dict | None = None,
                wait_for: str | None = None) -> Iterator:
    """Serve `root`, open `path` under it in a new watched page and wait for the selector `wait_for`; yields the page.
    After the block the page is closed and must have had no problems (`watch`)."""
    with serve_directory(root) as base_url:
        page = browser.new_page(viewport=viewport) if viewport else browser.new_page()
        problems = watch(page)
        page.goto(base_url + path, timeout=timeout_ms)
        if wait_for is not None:
            page.wait_for_selector(wait_for, timeout=timeout_ms)
        yield page
        page.close()
    assert not problems.summary(), problems.summary()
