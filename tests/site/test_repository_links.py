"""book/repository_links.py: the repository URL comes from git when _config.yml leaves it empty, is reduced to
https://host/owner/repo, and without one the launch buttons are switched off (sphinx-book-theme would fail)."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "book"))
from repository_links import configure, origin_remote, web_url  # noqa: E402

LAUNCH = {"notebook_interface": "jupyterlab", "binderhub_url": "https://mybinder.org",
          "jupyterhub_url": "https://hub.example.edu", "thebe": False}


@pytest.mark.parametrize("remote, expected", [
    ("git@github.com:someone/decodelab.git", "https://github.com/someone/decodelab"),
    ("https://github.com/someone/decodelab.git", "https://github.com/someone/decodelab"),
    ("https://someone:ghp_secret@github.com/someone/decodelab", "https://github.com/someone/decodelab"),
    ("ssh://git@gitlab.com:22/group/course.git", "https://gitlab.com/group/course"),
    ("https://bitbucket.org/team/course/", "https://bitbucket.org/team/course"),
    ("/work/main", None),                               # a local clone
    ("file:///srv/git/course.git", None),
    ("https://git.example.org/team/course.git", None),  # sphinx-book-theme needs repository_provider for other hosts
    ("https://github.com/someone/decodelab/tree/main", None),
])
def test_web_url(remote, expected):
    assert web_url(remote) == expected


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def build(confdir: Path, theme: dict) -> dict:
    configure(SimpleNamespace(confdir=str(confdir)), SimpleNamespace(html_theme_options=theme))
    return theme


def test_the_origin_remote_becomes_the_repository_button(tmp_path):
    git("init", "-q", cwd=tmp_path)
    git("remote", "add", "origin", "git@github.com:someone/decodelab.git", cwd=tmp_path)
    assert origin_remote(tmp_path) == "git@github.com:someone/decodelab.git"
    theme = build(tmp_path, {"repository_url": "", "launch_buttons": dict(LAUNCH)})
    assert theme["repository_url"] == "https://github.com/someone/decodelab"
    assert theme["use_repository_button"] is True
    assert theme["launch_buttons"] == LAUNCH


def test_a_configured_url_wins_over_git(tmp_path):
    git("init", "-q", cwd=tmp_path)
    git("remote", "add", "origin", "git@github.com:someone/fork.git", cwd=tmp_path)
    theme = build(tmp_path, {"repository_url": "https://github.com/course/decodelab", "launch_buttons": dict(LAUNCH)})
    assert theme["repository_url"] == "https://github.com/course/decodelab"
    assert theme["launch_buttons"] == LAUNCH


def test_without_a_url_there_are_no_launch_buttons(tmp_path):
    git("init", "-q", cwd=tmp_path)  # no remote
    assert origin_remote(tmp_path) is None
    assert origin_remote(tmp_path / "not-a-repository") is None
    theme = build(tmp_path, {"repository_url": "", "launch_buttons": dict(LAUNCH)})
    assert not theme["repository_url"] and "use_repository_button" not in theme
    assert theme["launch_buttons"] == {"notebook_interface": "jupyterlab", "thebe": False}
