"""Add slideshow metadata to chapter notebooks, so an instructor can present any chapter as slides with live
widgets (jupyterlab-deck inside JupyterLab; RISE and nbconvert read the same metadata).

Rule, per cell (`metadata.slideshow.slide_type`):
- a markdown cell whose first line is a `#` or `##` heading starts a new slide ("slide");
- a markdown cell whose first line is a `###` heading starts a vertical sub-slide ("subslide");
- every other cell stays on the current slide ("-"), written as *no* `slide_type` (nbconvert's and RISE's default):
  jupyterlab-deck 0.2.0 treats an explicit "-" as an unknown type and never shows the cell, so an explicit "-"
  (from JupyterLab's property inspector, say) is removed too;
- a cell tagged `remove-cell` (the book leaves it out, e.g. a chapter's last cell, which only glues figures for the
  Markdown pages) is "skip", whatever type it had: it would otherwise show its code on the last slide;
- a type an author chose by hand that the rule never writes ("fragment", "notes", and "skip" on other cells) is kept.
The notebook also gets `metadata.rise` options (scrolling slides, start at the first cell), unless it has its own.

Idempotent: a second run changes nothing. `--check` changes nothing and exits 1 when a notebook would change.

    python scripts/add_slide_metadata.py chapters/*.ipynb
    python scripts/add_slide_metadata.py --check chapters/*.ipynb

Taught in: README.md (for instructors: lecture mode)
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

HAND_CHOSEN = frozenset({"fragment", "skip", "notes"})
CONTINUE = "-"  # stays on the current slide; stored as the absence of `slide_type`
SKIP = "skip"
LEFT_OUT = "remove-cell"  # the tag with which Jupyter Book leaves a cell out of the page; slides leave it out too
RISE_DEFAULTS = {"scroll": True, "start_slideshow_at": "beginning", "enable_chalkboard": False}
_HEADING = re.compile(r"^(#{1,6})\s")


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def slide_type_for(cell: dict[str, Any]) -> str:
    """The slide type the rule gives `cell` (a notebook cell as a dict): "slide", "subslide", "skip" or "-"."""
    if not isinstance(cell, dict) or "cell_type" not in cell:
        raise TypeError(f"cell must be a notebook cell dict with a 'cell_type', got {cell!r:.80}")
    if LEFT_OUT in (cell.get("metadata") or {}).get("tags", []):
        return SKIP
    if cell["cell_type"] == "markdown":
        first_line = _source(cell).lstrip("\n").split("\n", 1)[0]
        match = _HEADING.match(first_line)
        if match:
            return "slide" if len(match.group(1)) <= 2 else "subslide" if len(match.group(1)) == 3 else "-"
    return CONTINUE


def with_slide_metadata(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of `notebook` (nbformat 4 JSON as a dict) with slide types and RISE options set by the rule.

    A cell that continues its slide ends up with no `slide_type` (and no `slideshow` dict if nothing else is in it)."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("notebook must be an nbformat 4 notebook dict with a 'cells' list")
    if notebook.get("nbformat") != 4:
        raise ValueError(f"notebook must be nbformat 4, got nbformat {notebook.get('nbformat')!r}")
    result = copy.deepcopy(notebook)
    for cell in result["cells"]:
        metadata = cell.setdefault("metadata", {})
        slideshow = dict(metadata.get("slideshow") or {})
        slide_type = slide_type_for(cell)
        if slide_type != SKIP and slideshow.get("slide_type") in HAND_CHOSEN:
            continue
        if slide_type == CONTINUE:
            slideshow.pop("slide_type", None)
        else:
            slideshow["slide_type"] = slide_type
        if slideshow:
            metadata["slideshow"] = slideshow
        else:
            metadata.pop("slideshow", None)
    rise = result.setdefault("metadata", {}).setdefault("rise", {})
    for key, value in RISE_DEFAULTS.items():
        rise.setdefault(key, value)
    return result


def _dump(notebook: dict[str, Any]) -> str:
    """JSON the way nbformat writes it (one-space indent, sorted keys, UTF-8), so diffs stay small."""
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def process(path: Path, check: bool) -> bool:
    """Add the metadata to the notebook at `path` (or only compare when `check`); True when it changes."""
    path = Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise ValueError(f"path must be an existing .ipynb file, got {path!s}")
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    updated = with_slide_metadata(notebook)
    changed = updated != notebook
    if changed and not check:
        path.write_text(_dump(updated), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks to update (e.g. chapters/*.ipynb)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook lacks the metadata")
    args = parser.parse_args(argv)
    changed = [path for path in args.notebooks if process(path, args.check)]
    for path in changed:
        print(f"{'needs slide metadata' if args.check else 'added slide metadata'}: {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
