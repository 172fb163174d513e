"""The course as one download: `decodelab-course.zip` in the built book, linked from every page's header.

A reader holding only the built book could download a chapter's .ipynb, which runs only inside the repository (it
imports `decodelab` and reads `chapters/data/*.json`). After an HTML build this extension writes
`_build/html/decodelab-course.zip`, one folder `decodelab-course/` holding

- `chapters/`: every chapter notebook and page, and `chapters/data/` (the stored benchmark runs the chapters read);
- `benchmarks/results/gpu/*.json`: the stored GPU run (`scripts/gpu_check.sh` on a lent H200) that chapters 06 and 07
  read from `../benchmarks/results/gpu/`;
- `exercises/`: the starter notebooks and `exercises/solutions/`;
- `decodelab-<version>-py3-none-any.whl`: the library, built from `lib/` with its package data (the shipped models
  under `decodelab/models/assets/`, the widgets' JavaScript and CSS);
- `requirements.txt`: the repository's pins of what the notebooks import (torch, transformers, JupyterLab, ...; not
  the book build's or the tests' tools) and the wheel, so pip takes everything else from the package registry;
- `README.md`: what it is, and the two commands (install, open JupyterLab).

It adds the archive to the header's download menu of every page, next to `.ipynb`, `.md` and `.pdf`, and the
footer (`_config.yml`) says what to do with it. The same module, run as a script, writes the archive anywhere:

    python book/course_archive.py _build/html/decodelab-course.zip
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_NAME = "decodelab-course.zip"
FOLDER = "decodelab-course"
# requirements.txt entries that only build the book or run the repository's tests; the notebooks import none of them
NOT_FOR_READERS = frozenset({
    "jupyter-book", "sphinx-exercise", "sphinx-togglebutton", "sphinx-book-theme", "pydata-sphinx-theme", "jieba",
    "pytest", "hypothesis", "pytest-xdist", "nbval", "pyyaml", "beautifulsoup4", "playwright", "triton", "schemathesis",
})
SKIPPED_PARTS = frozenset({"__pycache__", ".ipynb_checkpoints"})
GPU_RUN = Path("benchmarks/results/gpu")  # read by chapters 06 and 07 as ../benchmarks/results/gpu/; JSON only, no logs

README = """# 从概率到文本：语言模型的解码（课程包）

这是课程的全部可运行内容：`chapters/` 里是各章的 notebook 和它们读取的数据（`chapters/data/`），
`exercises/` 里是练习（答案在 `exercises/solutions/`），`{wheel}` 是课程的库 `decodelab`（含课程用的小模型），
`benchmarks/results/gpu/` 是第 6、7 章读取的一次 GPU 运行的存档。
torch 等依赖由 pip 从软件包仓库下载（`requirements.txt` 列出了验证过的版本）；装好之后，每一章和每个练习都能离线运行。

在解压出来的这个文件夹里运行两条命令（需要 Python 3.11 或更新的版本）：

```bash
python3 -m venv .venv && .venv/bin/pip install -r requirements.txt
.venv/bin/jupyter lab
```

第一条建一个虚拟环境并装好依赖（约 2 GB，只需一次），第二条打开 JupyterLab：从 `exercises/` 开始做练习，
或打开 `chapters/` 里的任意一章，Run → Run All Cells。（Windows 上把 `.venv/bin/` 换成 `.venv\\Scripts\\`。）

许可：课程代码（`decodelab` 与 notebook 中的代码）以 MIT 许可发布；正文与图以 CC BY-SA 4.0 发布。
"""


def _requirement_name(line: str) -> str | None:
    line = line.split("#", 1)[0].strip()
    if not line:
        return None
    return re.split(r"[<>=!~;\[\s]", line, maxsplit=1)[0].lower()


def reader_requirements(requirements: str, wheel_name: str) -> str:
    """The archive's requirements.txt: the repository's pinned lines that the notebooks need, then the wheel."""
    kept = [line.strip() for line in requirements.splitlines()
            if _requirement_name(line) is not None and _requirement_name(line) not in NOT_FOR_READERS]
    header = ("# What the chapters and exercises import, at the versions the course was verified with; "
              "the last line installs decodelab itself from this folder.\n")
    return header + "\n".join(kept) + f"\n./{wheel_name}\n"


def build_wheel(root: Path, out_dir: Path) -> Path:
    """Build decodelab's wheel from a clean copy of `root`'s pyproject.toml, README.md, LICENSE and lib/ (so no build/
    folder lands in the checkout), with the environment's setuptools; returns the wheel's path."""
    with tempfile.TemporaryDirectory(prefix="decodelab-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copyfile(root / name, source / name)
        shutil.copytree(root / "lib", source / "lib",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                                 "--wheel-dir", str(out_dir), str(source)],
                                capture_output=True, text=True, timeout=600, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"building the decodelab wheel failed:\n{result.stdout}\n{result.stderr}")
    wheels = sorted(out_dir.glob("decodelab-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one decodelab wheel in {out_dir}, found {[w.name for w in wheels]}")
    return wheels[0]


def _course_files(root: Path) -> list[Path]:
    """The chapters (notebooks, pages, data), the exercises and the stored GPU run's JSON, relative to `root`, sorted."""
    files = [path.relative_to(root) for path in (root / GPU_RUN).glob("*.json")]
    for folder in ("chapters", "exercises"):
        for path in (root / folder).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and not SKIPPED_PARTS.intersection(relative.parts):
                files.append(relative)
    return sorted(files)


def write_archive(target: Path, root: Path = ROOT) -> Path:
    """Write the course archive to `target` (a .zip path; its folder must exist); returns `target`."""
    target = Path(target)
    if target.suffix != ".zip":
        raise ValueError(f"target must be a .zip file name, got {target!s}")
    if not target.parent.is_dir():
        raise ValueError(f"the folder of target must exist, got {target.parent!s}")
    with tempfile.TemporaryDirectory(prefix="decodelab-course-") as tmp:
        wheel = build_wheel(root, Path(tmp))
        requirements = reader_requirements((root / "requirements.txt").read_text(encoding="utf-8"), wheel.name)
        partial = target.with_suffix(".zip.partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(f"{FOLDER}/README.md", README.format(wheel=wheel.name))
            archive.writestr(f"{FOLDER}/requirements.txt", requirements)
            archive.write(wheel, f"{FOLDER}/{wheel.name}")
            for relative in _course_files(root):
                archive.write(root / relative, f"{FOLDER}/{relative.as_posix()}")
        partial.replace(target)
    return target


# --- The Sphinx side -------------------------------------------------------------------------------------------

def add_archive_to_download_menu(app, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """Add the course archive to the header's download menu (sphinx-book-theme fills it at priority 501)."""
    for button in context.get("header_buttons", []):
        if button.get("label") == "download-buttons":
            button["buttons"].append({
                "type": "link",
                "url": context["pathto"](ARCHIVE_NAME, 1),
                "text": "课程包 .zip",
                "tooltip": "下载整个课程（notebook、数据、练习和 decodelab 库），解压后按其中 README.md 的两条命令运行",
                "icon": "fas fa-file-zipper",
                "label": "download-course-button",
            })


def write_archive_after_build(app, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        write_archive(Path(app.outdir) / ARCHIVE_NAME, Path(app.confdir))


def setup(app) -> dict[str, Any]:
    app.connect("html-page-context", add_archive_to_download_menu, priority=510)
    app.connect("build-finished", write_archive_after_build)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} TARGET.zip")
    print(write_archive(Path(sys.argv[1])))
