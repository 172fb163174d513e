"""The measurements chapter 07d shows: benchmarks/constrained.py's full run (tiny-zh, fixed seeds, one CPU thread:
validity, KL to the model's conditional and to the truth, mask cost per step), written to
chapters/data/07d-constrained.json (about 4 minutes).

    .venv/bin/python scripts/ch07d_constrained.py

Taught in: chapters/07d-constrained-decoding.ipynb
"""
import subprocess
import sys
from pathlib import Path

from provenance import stamp_file  # the command and library commit, added to the benchmark's JSON

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "constrained.py"), "--threads", "1",
                    "--out", str(ROOT / "chapters" / "data" / "07d-constrained.json")], check=True)
    stamp_file(ROOT / "chapters" / "data" / "07d-constrained.json", "python scripts/ch07d_constrained.py")
