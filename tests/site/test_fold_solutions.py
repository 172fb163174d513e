"""scripts/fold_solutions.py: the cells of a gated solution get JupyterLab's fold metadata, and only those; a second
run changes nothing; malformed gates and non-notebooks are refused with a message naming the cell. And the
committed chapters carry the metadata (run `python scripts/fold_solutions.py chapters/*.ipynb` after editing one)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fold_solutions.py"
sys.path.insert(0, str(SCRIPT.parent))

from fold_solutions import folded, main  # noqa: E402


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [], "execution_count": None}


def _nb(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


START = "```{solution-start} ex-1\n:class: dropdown\n```"
END = "```{solution-end}\n```"


def test_solution_cells_are_folded_and_nothing_else():
    notebook = _nb(_md("```{exercise} t\n:label: ex-1\n```"), _md(START), _code("answer = 1"), _md("why"), _md(END),
                   _code("after = 2"))
    result = folded(notebook)
    metadata = [cell["metadata"].get("jupyter") for cell in result["cells"]]
    assert metadata == [None, None, {"source_hidden": True, "outputs_hidden": True}, {"source_hidden": True}, None, None]
    assert notebook["cells"][2]["metadata"] == {}  # the input is not changed
    assert folded(result) == result


def test_malformed_gates_are_refused():
    with pytest.raises(ValueError, match="has no solution-end"):
        folded(_nb(_md(START), _code("x")))
    with pytest.raises(ValueError, match="cell 0 ends a solution"):
        folded(_nb(_md(END)))
    with pytest.raises(ValueError, match="cell 1 opens a solution while the one opened in cell 0"):
        folded(_nb(_md(START), _md(START), _md(END)))
    with pytest.raises(ValueError, match="nbformat 4"):
        folded({"cells": [], "nbformat": 3})
    with pytest.raises(ValueError, match="'cells' list"):
        folded([])


def test_check_mode_reports_and_changes_nothing(tmp_path, capsys):
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(_nb(_md(START), _code("x"), _md(END))), encoding="utf-8")
    before = path.read_text(encoding="utf-8")
    assert main(["--check", str(path)]) == 1 and path.read_text(encoding="utf-8") == before
    assert main([str(path)]) == 0 and main(["--check", str(path)]) == 0
    assert "would fold" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.ipynb")])


def test_committed_chapters_have_folded_solutions():
    chapters = sorted(str(path) for path in (ROOT / "chapters").glob("*.ipynb"))
    result = subprocess.run([sys.executable, str(SCRIPT), "--check", *chapters], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr + "(run: python scripts/fold_solutions.py chapters/*.ipynb)"
