"""Where a chapters/data/*.json file came from: the command that wrote it and the library commit it ran on.

Every script in scripts/ that writes chapter data passes its result through `stamp` before writing it, so the file
says how to make it again and which commit of decodelab made it. tests/site/test_data_provenance.py warns when the
library code a data file depends on has changed since that commit (the figures may then be stale: re-run the command).

    from provenance import stamp            # scripts/ is the script's own folder, first on sys.path
    result = stamp({"rows": rows}, "python scripts/ch04_snowball.py")

Used by: the scripts here that write chapters/data/*.json (long_form.py, ch03_beam_baseline.py, ch04_snowball.py, ch05_*.py,
ch06_timing.py, ch07_*.py, ch07b_speculative.py, ch07b_speed_ab.py, ch07b_engine_ab.py, ch07c_load.py, ch07d_constrained.py,
ch07d_overhead_ab.py, ch07e_best_of_n.py).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def library_commit(root: Path = ROOT) -> str:
    """HEAD's commit, with "-dirty" when lib/ has uncommitted changes (then the commit alone does not say what ran)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "lib"], cwd=root, capture_output=True, text=True,
                           check=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def stamp(result: dict, command: str, root: Path = ROOT) -> dict:
    """`result` with "command" and "library_commit" first (a new dict; `result` is not changed)."""
    if not isinstance(result, dict):
        raise TypeError(f"result must be a dict, got {type(result).__name__}")
    if not isinstance(command, str) or not command.startswith("python "):
        raise ValueError(f"command must be the shell command that writes the file, e.g. 'python scripts/x.py', "
                         f"got {command!r}")
    rest = {k: v for k, v in result.items() if k not in ("command", "library_commit")}
    return {"command": command, "library_commit": library_commit(root), **rest}


def write(path: Path, result: dict, command: str, root: Path = ROOT) -> None:
    """Stamp `result` (`stamp`) and write it to `path` as indented JSON (NaN refused), making its folder; says so."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = stamp(result, command, root)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def stamp_file(path: Path, command: str, root: Path = ROOT) -> None:
    """Stamp a JSON file another program wrote (the benchmarks the chapter 07b-07e scripts run), keeping its layout."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    indent = (len(lines[1]) - len(lines[1].lstrip())) or None if len(lines) > 1 else None  # None: one line
    data = stamp(json.loads(text), command, root)
    Path(path).write_text(json.dumps(data, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
