"""`make lab` as a student meets it: JupyterLab serves the repository root and opens on exercises/, so the link at the
top of a starter exercise ("对应章节：[...](../chapters/X.ipynb)") opens its chapter instead of a 404.

The flags come from the Makefile itself (`LAB_FLAGS`, read with `make -p`); the server runs them on a copy laid out
like the repository (exercises/, chapters/ with data/), in tests/lab.py's isolated JupyterLab."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from browser import watch
from lab import cells, makefile_variable, running_lab, screenshot

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = ROOT / "exercises" / "01-logits-to-probs.ipynb"
CHAPTER = ROOT / "chapters" / "01-logits-to-probs.ipynb"
TIMEOUT_MS = 90_000

pytestmark = pytest.mark.browser


def test_make_lab_serves_the_repository_root_and_opens_exercises():
    flags = shlex.split(makefile_variable("LAB_FLAGS"))
    assert "--ServerApp.root_dir=." in flags, flags
    assert "--LabApp.default_url=/lab/tree/exercises" in flags, flags
    recipe = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed",
                             "lab"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"jupyter lab .*--ServerApp\.root_dir=\. --LabApp\.default_url=/lab/tree/exercises", recipe), recipe


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lab-repo-root")
    for notebook in (EXERCISE, CHAPTER):
        (root / notebook.parent.name).mkdir(exist_ok=True)
        shutil.copyfile(notebook, root / notebook.parent.name / notebook.name)
    shutil.copytree(ROOT / "chapters" / "data", root / "chapters" / "data")
    return root


def test_exercise_link_opens_its_chapter(browser, served):
    flags = [flag for flag in shlex.split(makefile_variable("LAB_FLAGS")) if not flag.startswith("--ServerApp.root_dir")]
    with running_lab(served, extra_args=tuple(flags)) as lab:
        context = browser.new_context(viewport={"width": 1366, "height": 768}, locale="zh-CN")
        context.set_default_timeout(TIMEOUT_MS)
        problems = watch(context)
        page = context.new_page()
        page.goto(f"{lab.url}?token={lab.token}")  # the server's default URL: what `make lab` opens
        page.wait_for_url(re.compile(r"/lab/tree/exercises"), timeout=TIMEOUT_MS)
        page.locator(".jp-DirListing-item", has_text=EXERCISE.name).first.wait_for(timeout=TIMEOUT_MS)
        page.locator(".jp-DirListing-item", has_text=EXERCISE.name).first.dblclick()
        link = cells(page).first.locator("a", has_text="从 logits 到概率")
        link.first.wait_for(timeout=TIMEOUT_MS)
        screenshot(page, "root-exercise")
        link.first.click()
        # the chapter opens as a notebook tab in JupyterLab (not a 404, not the raw file): a second tab of the same
        # name, whose title gives the path under chapters/
        chapter_tab = page.locator(".lm-TabBar-tab[title*='chapters/01-logits-to-probs.ipynb']")
        chapter_tab.first.wait_for(timeout=TIMEOUT_MS)
        panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        # the chapter's title as rendered (an <h1> once its markdown cell is drawn; before that the cell holds only
        # its hidden source, whose text has no rendered form yet)
        title = panel.locator("h1", has_text="从 logits 到概率").first
        title.wait_for(state="visible", timeout=TIMEOUT_MS)
        heading = title.inner_text()
        screenshot(page, "root-chapter-from-link")
        context.close()
    assert "从 logits 到概率" in heading, heading[:200]
    serious = problems.page_errors + problems.failed_requests + problems.external_requests
    assert not serious, problems.summary()
