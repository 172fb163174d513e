"""Fold the solutions of a chapter notebook in JupyterLab and on its jupyterlab-deck slides.

The chapters write a solution as a gated block that spans cells (sphinx-exercise's syntax):

    ```{solution-start} ex-03-top-p        <- a markdown cell
    :class: dropdown
    ```
    def top_p_filter(...): ...              <- the solution's code cell(s)
    ```{solution-end}                       <- a markdown cell
    ```

The book folds it (`:class: dropdown`). jupyterlab-myst renders each cell on its own, so in JupyterLab the gated
block does not join the cells and the solution's code stood in plain view below the exercise. This script gives
every cell strictly between a `solution-start` cell and its `solution-end` cell the metadata JupyterLab folds on
open: `metadata.jupyter.source_hidden` and `outputs_hidden` (a code cell) or `source_hidden` (a markdown cell).
A reader clicks the fold bar to open it. nbval, nbconvert and myst-nb ignore this metadata.

Idempotent: a second run changes nothing. `--check` changes nothing and exits 1 when a notebook would change.

    python scripts/fold_solutions.py chapters/*.ipynb
    python scripts/fold_solutions.py --check chapters/*.ipynb
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

_START = re.compile(r"^\s*(```+|:::+)\{solution-start\}", re.MULTILINE)
_END = re.compile(r"^\s*(```+|:::+)\{solution-end\}", re.MULTILINE)


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def folded(notebook: dict[str, Any]) -> dict[str, Any]:
    """A copy of `notebook` (nbformat 4 JSON as a dict) whose solution cells carry JupyterLab's fold metadata.

    Raises ValueError for a notebook that is not nbformat 4, or whose solution-start has no solution-end."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("notebook must be an nbformat 4 notebook dict with a 'cells' list")
    if notebook.get("nbformat") != 4:
        raise ValueError(f"notebook must be nbformat 4, got nbformat {notebook.get('nbformat')!r}")
    result = copy.deepcopy(notebook)
    inside_since: int | None = None
    for index, cell in enumerate(result["cells"]):
        text = _source(cell) if cell.get("cell_type") == "markdown" else ""
        if _END.search(text):
            if inside_since is None:
                raise ValueError(f"cell {index} ends a solution (solution-end) that no solution-start opened")
            inside_since = None
            # a solution-end cell may open the next exercise, or the next solution
        if inside_since is not None:
            jupyter = cell.setdefault("metadata", {}).setdefault("jupyter", {})
            jupyter["source_hidden"] = True
            if cell.get("cell_type") == "code":
                jupyter["outputs_hidden"] = True
        if _START.search(text):
            if inside_since is not None:
                raise ValueError(f"cell {index} opens a solution while the one opened in cell {inside_since} is "
                                 "still open (no solution-end between them)")
            inside_since = index
    if inside_since is not None:
        raise ValueError(f"the solution opened in cell {inside_since} has no solution-end cell")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    args = parser.parse_args(argv)
    changed = []
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            parser.error(f"not a notebook file: {path}")
        notebook = json.loads(path.read_text(encoding="utf-8"))
        new = folded(notebook)
        if new != notebook:
            changed.append(path)
            if not args.check:
                path.write_text(json.dumps(new, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for path in changed:
        print(f"{'would fold' if args.check else 'folded'} the solutions of {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
