"""The repository button and the Binder/JupyterHub launch buttons, wherever the book is built from a published clone.

`_config.yml` names no repository URL: the course is developed in a local repository, and a URL written there would
be wrong in every fork. When `repository.url` is empty this extension asks git for the `origin` remote of the
checkout the book is built from (a clone of GitHub, GitLab or Bitbucket, as in CI) and, if there is one, sets it as
the theme's `repository_url` and turns on the repository button. The launch buttons configured in `_config.yml`
(`launch_buttons`: Binder, a class's JupyterHub) need that URL too; without one they are switched off, with a line in
the build log, since sphinx-book-theme cannot build their links (it fails on every notebook page instead).

The URL is reduced to `https://host/owner/repo`: an SSH remote is rewritten, and user names or tokens in an HTTPS
remote never reach the pages.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.util import logging

logger = logging.getLogger(__name__)

# the hosts sphinx-book-theme recognises without a `repository_provider`
KNOWN_HOSTS = ("github.com", "gitlab.com", "bitbucket.org")
REMOTE = re.compile(
    r"^(?:(?:https?|ssh|git)://(?:[^@/]+@)?(?P<host>[^/:]+)(?::\d+)?/|[^@/]+@(?P<scp_host>[^:/]+):)"
    r"(?P<path>[^?#]+?)(?:\.git)?/?$"
)
LAUNCH_URL_KEYS = ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url", "jupyterlite_url")


def web_url(remote: str) -> str | None:
    """`https://host/owner/repo` for a git remote on a known host, else None.

    >>> web_url("git@github.com:someone/decodelab.git")
    'https://github.com/someone/decodelab'
    """
    match = REMOTE.match(remote.strip())
    if match is None:
        return None
    host = (match["host"] or match["scp_host"]).lower()
    path = match["path"].strip("/")
    if host not in KNOWN_HOSTS or path.count("/") != 1:
        return None
    return f"https://{host}/{path}"


def origin_remote(root: Path) -> str | None:
    """The URL of the `origin` remote of the git checkout at `root`, or None (no git, no repository, no origin)."""
    try:
        result = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def configure(app: Sphinx, config: Config) -> None:
    """Fill in the repository URL from git when `_config.yml` leaves it empty; without one, no launch buttons."""
    theme = config.html_theme_options
    url = theme.get("repository_url") or None
    if url is None:
        remote = origin_remote(Path(app.confdir))
        url = web_url(remote) if remote else None
        if url is not None:
            theme["repository_url"] = url
            theme["use_repository_button"] = True
            logger.info("repository: the pages link to %s (git remote origin)", url)
    launch = theme.get("launch_buttons") or {}
    configured = [key for key in LAUNCH_URL_KEYS if launch.get(key)]
    if url is None and configured:
        logger.info("repository: no repository URL (repository.url in _config.yml, or a git remote origin on %s); "
                    "no launch buttons (%s)", ", ".join(KNOWN_HOSTS), ", ".join(configured))
        theme["launch_buttons"] = {key: value for key, value in launch.items() if key not in LAUNCH_URL_KEYS}


def setup(app: Sphinx) -> dict[str, Any]:
    # jupyter-book has copied _config.yml into html_theme_options before config-inited; sphinx-book-theme reads them
    # at builder-inited
    app.connect("config-inited", configure)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
