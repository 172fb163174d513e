"""The course a reader downloads (book/course_archive.py): one zip with the chapters and their data, the exercises, a
decodelab wheel with the shipped models, its own requirements file and a README with two commands; unpacked into a
temporary folder it runs a chapter and an exercise under nbval with nothing from the repository.

Nothing new is installed: the wheel goes into a folder of the temporary directory (`pip install --no-deps --target`)
put first on PYTHONPATH, so the kernels import decodelab from the wheel and take torch and the rest from this venv,
as a reader's `pip install -r requirements.txt` would give them. The header link is checked on the built book."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
SANITIZE = ROOT / "tests" / "sanitize.cfg"
RUN_CHAPTER = "chapters/01-logits-to-probs.ipynb"
RUN_EXERCISE = "exercises/01-logits-to-probs.ipynb"


def _archive_module():
    spec = importlib.util.spec_from_file_location("course_archive", ROOT / "book" / "course_archive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_archive = _archive_module()


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return course_archive.write_archive(tmp_path_factory.mktemp("archive") / course_archive.ARCHIVE_NAME)


@pytest.fixture(scope="module")
def unpacked(archive, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("reader")
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(target)
    return target / course_archive.FOLDER


def test_write_archive_checks_its_target(tmp_path):
    with pytest.raises(ValueError, match="must be a .zip"):
        course_archive.write_archive(tmp_path / "course.tar")
    with pytest.raises(ValueError, match="must exist"):
        course_archive.write_archive(tmp_path / "missing" / "course.zip")


def test_archive_holds_the_whole_course(unpacked):
    for folder in ("chapters", "exercises"):
        expected = {path.relative_to(ROOT).as_posix() for path in (ROOT / folder).rglob("*")
                    if path.is_file() and not {"__pycache__", ".ipynb_checkpoints"} & set(path.parts)}
        found = {path.relative_to(unpacked).as_posix() for path in (unpacked / folder).rglob("*") if path.is_file()}
        assert found == expected, (sorted(expected - found)[:5], sorted(found - expected)[:5])
    assert (unpacked / "chapters" / "data").is_dir()
    # the stored GPU run chapters 06 and 07 read as ../benchmarks/results/gpu/ (its JSON; logs stay in the repository)
    gpu = {path.name for path in (ROOT / "benchmarks/results/gpu").glob("*.json")}
    assert gpu and gpu == {path.name for path in (unpacked / "benchmarks/results/gpu").glob("*.json")}
    wheels = list(unpacked.glob("decodelab-*-py3-none-any.whl"))
    assert len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    models = {path.relative_to(ROOT / "lib").as_posix() for path in (ROOT / "lib/decodelab/models/assets").rglob("*")
              if path.is_file()}
    assert models and models <= names, sorted(models - names)[:5]
    assert any(name.startswith("decodelab/book/widgets/") and name.endswith(".js") for name in names)


def test_requirements_pin_what_the_notebooks_need_and_install_the_wheel(unpacked):
    lines = [line for line in (unpacked / "requirements.txt").read_text("utf-8").splitlines()
             if line and not line.startswith("#")]
    repo_pins = {line.split("==")[0].lower(): line for line in (ROOT / "requirements.txt").read_text("utf-8").splitlines()
                 if "==" in line and not line.startswith("#")}
    wheel = next(unpacked.glob("decodelab-*.whl")).name
    assert lines[-1] == f"./{wheel}"
    for line in lines[:-1]:
        name = re.split(r"[=<>~!; ]", line, maxsplit=1)[0].lower()
        assert repo_pins.get(name) == line, f"{line!r} is not the repository's pin"
    names = {re.split(r"[=<>~!; ]", line, maxsplit=1)[0].lower() for line in lines[:-1]}
    assert {"torch", "transformers", "jupyterlab", "ipywidgets", "anywidget", "matplotlib"} <= names
    assert not names & {"jupyter-book", "pytest", "playwright", "nbval", "schemathesis", "hypothesis"}


def test_readme_gives_two_commands(unpacked):
    readme = (unpacked / "README.md").read_text("utf-8")
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block, readme
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["python3 -m venv .venv && .venv/bin/pip install -r requirements.txt", ".venv/bin/jupyter lab"]
    assert "CC BY-SA 4.0" in readme and "MIT" in readme


@pytest.mark.slow
def test_unpacked_course_runs_a_chapter_and_an_exercise_under_nbval(unpacked, tmp_path):
    site = tmp_path / "site"
    wheel = next(unpacked.glob("decodelab-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    where = subprocess.run([sys.executable, "-c", "import decodelab; print(decodelab.__file__)"], cwd=unpacked,
                           env=env, capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                             "--nbval", "--nbval-sanitize-with", str(SANITIZE), RUN_CHAPTER, RUN_EXERCISE],
                            cwd=unpacked, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b\d+ passed", result.stdout), result.stdout[-2000:]


@pytest.mark.book
def test_every_page_links_the_archive_and_says_what_to_do(built_book):
    assert (built_book / course_archive.ARCHIVE_NAME).is_file()
    for page in sorted((built_book / "chapters").glob("*.html")):
        soup = BeautifulSoup(page.read_text("utf-8"), "html.parser")
        links = [a for a in soup.select(".article-header-buttons a[href]")
                 if a["href"].endswith(course_archive.ARCHIVE_NAME)]
        assert links, f"{page.name}: no link to the course archive in the header"
        assert (page.parent / links[0]["href"]).resolve() == (built_book / course_archive.ARCHIVE_NAME).resolve()
        footer = soup.select_one("footer.bd-footer-content").get_text(" ")
        assert "课程包 .zip" in footer and "pip install -r requirements.txt" in footer and "jupyter lab" in footer
