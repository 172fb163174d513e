"""The measurements chapter 07b shows: benchmarks/speculative.py's full run (12 prompts, 128 tokens, gamma in
{1, 2, 3, 4, 6, 8}, one CPU thread), written to chapters/data/07b-speculative.json (about 2 minutes).

    .venv/bin/python scripts/ch07b_speculative.py

Taught in: chapters/07b-speculative-decoding.ipynb
"""
import subprocess
import sys
from pathlib import Path

from provenance import stamp_file  # the command and library commit, added to the benchmark's JSON

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "speculative.py"), "--threads", "1",
                    "--out", str(ROOT / "chapters" / "data" / "07b-speculative.json")], check=True)
    stamp_file(ROOT / "chapters" / "data" / "07b-speculative.json", "python scripts/ch07b_speculative.py")
