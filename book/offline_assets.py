"""Serve the book's third-party JavaScript from the book itself, so pages work with the network cut off.

`scripts/fetch_offline_assets.sh` puts MathJax 3, require.js and the ipywidgets embed manager into the git-ignored
`_offline/` folder. When that folder is complete, this extension:

- adds `_offline/` and `book/static/` to `html_static_path` (their files land in `_build/html/_static/`; not the
  source `_static/` folder, whose every .js Jupyter Book adds to every page);
- points `mathjax_path` at the local MathJax;
- makes myst-nb load, on pages with widgets, the local require.js, a require config that maps `@jupyter-widgets/*`
  and `anywidget` to local files, a MathJax 2 shim (below) and the local `embed-amd.js`;
- copies anywidget's require.js loader (`nbextension/index.js`) out of the installed Python package into the built
  `_static/anywidget/`, so anywidget widgets render from their stored state without a kernel or a CDN.

Without `_offline/` it logs that the pages will use CDN links and keeps Sphinx's and myst-nb's CDN defaults.

In both cases widget pages also load `book/static/widgets-mathjax-shim.js`: the widget manager typesets labels with
MathJax 2's `MathJax.Hub.Queue`, which MathJax 3 lacks (an uncaught TypeError on every page with math and widgets).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

logger = logging.getLogger(__name__)

OFFLINE_DIR = "_offline"
REQUIRED_FILES = ("mathjax/tex-mml-chtml.js", "requirejs/require.js", "widgets/embed-amd.js")
BOOK_STATIC_DIR = Path(__file__).resolve().parent / "static"
MATHJAX_PATH = "mathjax/tex-mml-chtml.js"
MATHJAX_SHIM = "widgets-mathjax-shim.js"
# Loaded in this order on every page that stores widget state; paths are relative to _build/html/_static/.
OFFLINE_IPYWIDGETS_JS: dict[str, dict[str, str]] = {
    "requirejs/require.js": {},
    "widgets-require-config.js": {},
    MATHJAX_SHIM: {},
    "widgets/embed-amd.js": {},
}
ANYWIDGET_LOADER_TARGET = Path("_static") / "anywidget" / "index.js"


def missing_offline_files(root: Path) -> list[str]:
    """The files of `_offline/` that the offline set-up needs and that are absent under `root`."""
    return [name for name in REQUIRED_FILES if not (root / OFFLINE_DIR / name).is_file()]


def anywidget_loader() -> Path | None:
    """anywidget's require.js loader as shipped in its wheel, or None when anywidget is not installed."""
    try:
        import anywidget
    except ImportError:
        return None
    loader = Path(anywidget.__file__).parent / "nbextension" / "index.js"
    return loader if loader.is_file() else None


def with_mathjax_shim(cdn_scripts: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """myst-nb's CDN widget scripts with the MathJax 2 shim inserted before the last one (embed-amd.js)."""
    items = list(cdn_scripts.items())
    return dict([*items[:-1], (MATHJAX_SHIM, {}), *items[-1:]])


def configure(app: Sphinx, config: Config) -> None:
    """Wire the local files into the Sphinx and myst-nb configuration when `_offline/` is complete."""
    root = Path(app.confdir)
    static_paths = list(config.html_static_path)
    if str(BOOK_STATIC_DIR) not in static_paths:
        static_paths.append(str(BOOK_STATIC_DIR))
    missing = missing_offline_files(root)
    if missing:
        config.html_static_path = static_paths
        config.nb_ipywidgets_js = with_mathjax_shim(config.nb_ipywidgets_js)
        logger.info(
            "offline_assets: %s/ lacks %s; pages will load MathJax and the widget JavaScript from CDNs "
            "(run scripts/fetch_offline_assets.sh to serve them locally)",
            OFFLINE_DIR, ", ".join(missing),
        )
        return
    config.html_static_path = [*static_paths, OFFLINE_DIR]
    config.mathjax_path = MATHJAX_PATH
    config.nb_ipywidgets_js = dict(OFFLINE_IPYWIDGETS_JS)
    logger.info("offline_assets: serving MathJax, require.js and the widget manager from %s/", OFFLINE_DIR)


def copy_anywidget_loader(app: Sphinx, exception: Exception | None) -> None:
    """Copy anywidget's loader into the built `_static/` once an offline HTML build has finished."""
    if exception is not None or app.builder.format != "html":
        return
    if missing_offline_files(Path(app.confdir)):
        return
    loader = anywidget_loader()
    if loader is None:
        logger.info("offline_assets: anywidget is not installed; no anywidget loader copied")
        return
    target = Path(app.outdir) / ANYWIDGET_LOADER_TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(loader, target)


def setup(app: Sphinx) -> dict[str, Any]:
    # Before myst-nb reads nb_ipywidgets_js (builder-inited) and before sphinx.ext.mathjax reads mathjax_path.
    app.connect("config-inited", configure, priority=100)
    app.connect("build-finished", copy_anywidget_loader)
    app.add_css_file("course.css")  # book/static/course.css: the course's own styles (computed tables, layout)
    app.add_js_file("nav-toggles.js")  # book/static/nav-toggles.js: the article header's sidebar buttons work
    app.add_js_file("scroll-cues.js")  # book/static/scroll-cues.js: boxes that scroll sideways say so
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
