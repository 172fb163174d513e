"""Lecture mode without a browser: the slideshow extensions in requirements.txt (jupyterlab-deck, which presents
live widgets; RISE while it is listed) are installed and enabled in the venv's JupyterLab, and
scripts/add_slide_metadata.py gives every cell of a notebook a slide type by the heading rule, idempotently, writing
"continue" as no `slide_type` (jupyterlab-deck 0.2.0 hides a cell whose type is an explicit "-") and "skip" for a
cell the book leaves out (tag `remove-cell`: a chapter's last cell, which glues figures for the Markdown pages).

The browser side (a chapter presented with jupyterlab-deck, its live explorer moved on the slide) is
tests/site/test_lab_browser.py::test_instructor_presents_a_chapter_as_slides."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "add_slide_metadata.py"
sys.path.insert(0, str(SCRIPT.parent))

from add_slide_metadata import main, slide_type_for, with_slide_metadata  # noqa: E402


def _markdown(text: str, **metadata) -> dict:
    return {"cell_type": "markdown", "metadata": metadata, "source": text}


def _code(text: str, **metadata) -> dict:
    return {"cell_type": "code", "metadata": metadata, "source": text, "outputs": [], "execution_count": None}


def _notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


# requirements.txt name -> the JupyterLab extensions it must install (jupyterlab-deck needs jupyterlab-fonts).
SLIDESHOW_EXTENSIONS = {
    "jupyterlab-deck": ("@deathbeds/jupyterlab-deck", "@deathbeds/jupyterlab-fonts"),
    "jupyterlab-rise": ("jupyterlab-rise",),
}


def _types(notebook: dict) -> list[str]:
    """Each cell's slide type, "-" (continue) where it has none."""
    return [cell["metadata"].get("slideshow", {}).get("slide_type", "-") for cell in notebook["cells"]]


def _required_slideshow_packages() -> list[str]:
    names = [re.split(r"[<>=!~;\[\s]", line.strip(), maxsplit=1)[0].lower()
             for line in (ROOT / "requirements.txt").read_text("utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return [name for name in SLIDESHOW_EXTENSIONS if name in names]


@pytest.mark.slow
def test_slideshow_extensions_are_installed_and_enabled():
    """jupyterlab-deck (live widgets on slides) must be in requirements.txt; every slideshow package listed there
    must have its JupyterLab extensions installed, enabled and OK in the venv."""
    required = _required_slideshow_packages()
    assert "jupyterlab-deck" in required, "requirements.txt must list jupyterlab-deck (lecture mode)"
    jupyter = Path(sys.executable).parent / "jupyter"
    listing = subprocess.run([str(jupyter), "labextension", "list"], capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)  # drop the colour codes
    for package in required:
        for extension in SLIDESHOW_EXTENSIONS[package]:
            line = next((line for line in text.splitlines() if line.split()[:1] == [extension]), None)
            assert line is not None, f"{extension} (from {package}) is not installed in {jupyter}:\n{text}"
            assert "enabled" in line and "OK" in line, f"{extension} is not enabled and OK: {line.strip()}"


def test_heading_rule():
    assert slide_type_for(_markdown("# 第 2 章")) == "slide"
    assert slide_type_for(_markdown("\n## 本页结论\n\n- 一")) == "slide"
    assert slide_type_for(_markdown("### 例子")) == "subslide"
    assert slide_type_for(_markdown("#### 细节")) == "-"
    assert slide_type_for(_markdown("正文，提到 #1 号 token")) == "-"
    assert slide_type_for(_markdown("#标签不是标题")) == "-"
    assert slide_type_for(_code("# 一个注释\nx = 1")) == "-"
    assert slide_type_for({"cell_type": "raw", "metadata": {}, "source": ["## 不是 markdown"]}) == "-"
    assert slide_type_for(_code("glue('key', 1, display=False)", tags=["remove-cell"])) == "skip"
    assert slide_type_for(_markdown("## 只给 glue 用", tags=["remove-cell"])) == "skip"
    assert slide_type_for(_code("x = 1", tags=["remove-input"])) == "-"


def test_notebook_metadata_is_complete_idempotent_and_keeps_hand_choices():
    notebook = _notebook(
        _markdown("# 标题"), _code("x = 1"), _markdown("### 小节"),
        _markdown("讲稿", slideshow={"slide_type": "notes"}), _markdown("## 下一页", slideshow={"slide_type": "-"}),
        _code("explorer"), _code("y = 2", slideshow={"slide_type": "-"}),
        _code("z = 3", slideshow={"slide_type": "-", "x": 1}),
    )
    before = json.dumps(notebook, sort_keys=True)
    once = with_slide_metadata(notebook)
    assert json.dumps(notebook, sort_keys=True) == before, "the input notebook was modified"
    assert _types(once) == ["slide", "-", "subslide", "notes", "slide", "-", "-", "-"]
    # "continue" is no slide_type at all, never an explicit "-" (which jupyterlab-deck 0.2.0 never shows)
    assert [cell["metadata"].get("slideshow") for cell in once["cells"]] == [
        {"slide_type": "slide"}, None, {"slide_type": "subslide"}, {"slide_type": "notes"}, {"slide_type": "slide"},
        None, None, {"x": 1}]
    assert once["metadata"]["rise"]["scroll"] is True
    assert with_slide_metadata(once) == once


def test_cells_the_book_leaves_out_are_skipped():
    """A `remove-cell` cell is "skip" whatever type it had (also a hand-chosen one: the book hides it, so do the
    slides); "skip" chosen by hand on another cell is kept; a second run changes nothing."""
    glue = "from myst_nb import glue\nglue('vocab_size', 473, display=False)"
    notebook = _notebook(
        _markdown("## 本页结论"), _code(glue, tags=["remove-cell"]),
        _code(glue, tags=["remove-cell"], slideshow={"slide_type": "-"}),
        _code(glue, tags=["hide-input", "remove-cell"], slideshow={"slide_type": "notes"}),
        _markdown("## 只给 glue 用", tags=["remove-cell"], slideshow={"slide_type": "slide"}),
        _code("x = 1", slideshow={"slide_type": "skip"}),
    )
    once = with_slide_metadata(notebook)
    assert _types(once) == ["slide", "skip", "skip", "skip", "skip", "skip"]
    assert [cell["metadata"].get("tags") for cell in once["cells"]] == [
        cell["metadata"].get("tags") for cell in notebook["cells"]], "the tags were changed"
    assert with_slide_metadata(once) == once


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="notebook must be an nbformat 4 notebook dict"):
        with_slide_metadata({"cells": "no"})
    with pytest.raises(ValueError, match="notebook must be nbformat 4, got nbformat 3"):
        with_slide_metadata({"cells": [], "nbformat": 3})
    with pytest.raises(TypeError, match="cell must be a notebook cell dict"):
        slide_type_for({"source": "# x"})
    with pytest.raises(ValueError, match="path must be an existing .ipynb file"):
        main(["README.md"])


def test_script_on_copies_of_the_course_notebooks(tmp_path):
    """The command line, on temporary copies of every committed chapter and exercise notebook: --check reports the
    missing metadata, a run adds it (a slide per top heading), a second run and --check change nothing."""
    sources = sorted(ROOT.glob("chapters/*.ipynb")) + sorted(ROOT.glob("exercises/*.ipynb"))
    assert sources, "no notebook found under chapters/ or exercises/"
    copies = []
    for source in sources:
        copy = tmp_path / source.parent.name / source.name
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, copy)
        copies.append(copy)
    command = [sys.executable, str(SCRIPT)]
    first = subprocess.run(command + [str(p) for p in copies], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    for source, copy in zip(sources, copies):
        original, updated = json.loads(source.read_text("utf-8")), json.loads(copy.read_text("utf-8"))
        assert len(updated["cells"]) == len(original["cells"])
        assert [c["source"] for c in updated["cells"]] == [c["source"] for c in original["cells"]]
        assert [c.get("outputs") for c in updated["cells"]] == [c.get("outputs") for c in original["cells"]]
        types = _types(updated)
        assert types[0] == "slide", f"{source.name}: the title cell must open the first slide, got {types[0]!r}"
        left_out = [i for i, c in enumerate(updated["cells"]) if "remove-cell" in c["metadata"].get("tags", [])]
        headings = [i for i, c in enumerate(updated["cells"])
                    if c["cell_type"] == "markdown" and re.match(r"#{1,2}\s", "".join(c["source"]).lstrip("\n"))
                    and i not in left_out]
        assert [i for i, t in enumerate(types) if t == "slide"] == headings, source.name
        assert [types[i] for i in left_out] == ["skip"] * len(left_out), f"{source.name}: a remove-cell cell is shown"
        explicit = [i for i, cell in enumerate(updated["cells"])
                    if cell["metadata"].get("slideshow", {}).get("slide_type") == "-"]
        assert not explicit, f"{source.name}: cells {explicit} have an explicit '-' (jupyterlab-deck hides them)"
    stamp = [copy.read_bytes() for copy in copies]
    again = subprocess.run(command + [str(p) for p in copies], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr
    assert [copy.read_bytes() for copy in copies] == stamp, "a second run changed a notebook"
    check = subprocess.run(command + ["--check"] + [str(p) for p in copies], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout
    bare = json.loads(sources[0].read_text("utf-8"))
    for cell in bare["cells"]:
        cell["metadata"].pop("slideshow", None)
    fresh = tmp_path / "bare.ipynb"
    fresh.write_text(json.dumps(bare, indent=1, ensure_ascii=False), encoding="utf-8")
    stamp = fresh.read_bytes()
    missing = subprocess.run(command + ["--check", str(fresh)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and f"needs slide metadata: {fresh}" in missing.stdout, missing.stdout
    assert fresh.read_bytes() == stamp, "--check modified the notebook"


def test_committed_chapters_carry_slide_metadata():
    """Every chapter can be presented as slides as committed: the script has nothing left to add."""
    chapters = sorted(str(path) for path in (ROOT / "chapters").glob("*.ipynb"))
    assert chapters, "no chapter notebooks found"
    result = subprocess.run([sys.executable, str(SCRIPT), "--check", *chapters], capture_output=True, text=True)
    assert result.returncode == 0, ("chapters lack slide metadata; run "
                                    f"`python scripts/add_slide_metadata.py chapters/*.ipynb`:\n{result.stdout}{result.stderr}")
