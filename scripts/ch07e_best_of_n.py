"""The measurements chapter 07e shows: benchmarks/best_of_n.py's full run (tiny-zh-doc, 200 questions x 16 samples at
T = 0.7, 1 and 1.5, fixed seeds, one CPU thread: best-of-n accuracy under three verifiers, pass@k, token cost, KV
blocks saved by sharing), written to chapters/data/07e-best-of-n.json (about 2 minutes).

    .venv/bin/python scripts/ch07e_best_of_n.py

Taught in: chapters/07e-best-of-n.ipynb
"""
import subprocess
import sys
from pathlib import Path

from provenance import stamp_file  # the command and library commit, added to the benchmark's JSON

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "best_of_n.py"), "--threads", "1",
                    "--out", str(ROOT / "chapters" / "data" / "07e-best-of-n.json")], check=True)
    stamp_file(ROOT / "chapters" / "data" / "07e-best-of-n.json", "python scripts/ch07e_best_of_n.py")
