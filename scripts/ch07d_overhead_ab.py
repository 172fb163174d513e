"""Chapter 07d's mask overhead from interleaved A/B repeats: the cost of one grammar mask + advance against one model
forward per decode step, written to chapters/data/07d-overhead-ab.json (about 2 minutes on the 2-core course machine
while other jobs shared it).

    .venv/bin/python scripts/ch07d_overhead_ab.py [--repeats 10] [--sentences 200]

Each repeat is benchmarks/constrained.py's `overhead`: tiny-zh's decode forwards at batch 1 replayed over the same
toy-language sentences (`ToyLanguage().sample(200, seed=3)`, one torch thread), then, right after, each grammar's
mask + advance replayed over them (the toy language's automaton, and llguidance regexes "city" and "form"; each
grammar freshly built, so no cache is warm from the repeat before). A load change from other jobs on the shared CPU
thus hits both sides of a repeat. Per grammar it reports the median over repeats of the paired ratio (median mask ms
/ median forward ms, of the same repeat) with a percentile bootstrap 95% interval over repeats
(scripts/ch07b_speed_ab.py's `bootstrap_median`: 2000 resamples, seed 0), and each side's per-repeat medians.
CPU figures: they depend on the machine and its load.

Taught in: chapters/07d-constrained-decoding.ipynb
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ch07b_speed_ab import bootstrap_median  # scripts/ is this script's folder, first on sys.path
from provenance import write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from constrained import CITY, FORM, overhead  # noqa: E402  (benchmarks/constrained.py)

from decodelab.grammar import LLGuidanceGrammar, ToyLanguageGrammar  # noqa: E402
from decodelab.models import load_model  # noqa: E402
from decodelab.toy import ToyLanguage  # noqa: E402

OUT = ROOT / "chapters" / "data" / "07d-overhead-ab.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="interleaved A/B repeats (default 10)")
    parser.add_argument("--sentences", type=int, default=200, help="sentences replayed per repeat (default 200)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2, got {args.repeats}")
    if args.sentences < 1:
        parser.error(f"--sentences must be at least 1, got {args.sentences}")
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny-zh", device="cpu")
    grammars = {"toy": lambda: ToyLanguageGrammar(tokenizer, ToyLanguage()),  # a fresh language: no warm caches
                "city": lambda: LLGuidanceGrammar.regex(CITY, tokenizer),
                "form": lambda: LLGuidanceGrammar.regex(FORM, tokenizer)}
    sentences = ToyLanguage().sample(args.sentences, seed=3)
    start = time.perf_counter()
    repeats = []
    for repeat in range(args.repeats):
        repeats.append(overhead(model, tokenizer, grammars, sentences))
        print(f"repeat {repeat + 1}/{args.repeats}: {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    print("| grammar | steps | median paired mask / forward [95% CI] | mask ms (median) | forward ms min-max |")
    print("|---|---:|---:|---:|---:|")
    for name in grammars:
        runs = [[row for row in rep if row["grammar"] == name][0] for rep in repeats]
        ratios = [run["ratio"] for run in runs]
        low, high = bootstrap_median(ratios)
        mask, forward = [run["mask_ms"] for run in runs], [run["forward_ms"] for run in runs]
        rows.append({"grammar": name, "steps": runs[0]["steps"], "median_ratio": statistics.median(ratios),
                     "ci_low": low, "ci_high": high, "ratios": ratios, "mask_ms": mask, "forward_ms": forward})
        print(f"| {name} | {runs[0]['steps']} | {100 * rows[-1]['median_ratio']:.2f}% [{100 * low:.2f}, "
              f"{100 * high:.2f}] | {statistics.median(mask):.3f} | {min(forward):.2f}-{max(forward):.2f} |")
    write(OUT, {
        "model": "tiny-zh (shipped)", "device": "cpu", "threads": 1, "repeats": args.repeats,
        "sentences": args.sentences, "city": CITY, "form": FORM,
        "note": "CPU figures on a CPU shared with other jobs: each repeat replays the model's decode forwards and "
                "then each grammar's mask + advance over the same sentences; ratio = median mask ms / median "
                "forward ms of the same repeat; interval = percentile bootstrap over repeats (2000 resamples, seed 0)",
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "seconds": time.perf_counter() - start, "rows": rows,
    }, "python scripts/ch07d_overhead_ab.py")


if __name__ == "__main__":
    main()
