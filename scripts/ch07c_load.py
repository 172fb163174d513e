"""Chapter 07c's load measurements: benchmarks/load.py's full run (continuous and static batching, rates 8-96 req/s
and a burst of 200 clients, 200 requests per run) over 5 workload seeds, written to chapters/data/07c-serving-load.json
with the command and library commit (17 minutes on the 2-core course machine while other jobs shared it).

    .venv/bin/python scripts/ch07c_load.py

The chapter reads the JSON's "summary": per mode and rate, the median and interquartile range over the 5 seeds of the
p50 and p99 latencies and of the throughput. CPU figures: server and clients share the machine's cores.

Taught in: chapters/07c-serving.ipynb
"""
import subprocess
import sys
from pathlib import Path

from provenance import stamp_file  # the command and library commit, added to the benchmark's JSON

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "chapters" / "data" / "07c-serving-load.json"

if __name__ == "__main__":
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "load.py"), "--rates", "8,16,32,48,64,96,burst",
                    "--seeds", "0,1,2,3,4", "--out", str(OUT)], check=True)
    stamp_file(OUT, "python scripts/ch07c_load.py")
