"""Chapter 07b's engine figures: speculation inside the continuous-batching Engine against the same Engine without
it, from interleaved A/B repeats, written to chapters/data/07b-speculative-engine.json (about 6 minutes on the 2-core
course machine while other jobs shared it).

    .venv/bin/python scripts/ch07b_engine_ab.py [--repeats 10]

The run is benchmarks/speculative.py's `measure_engine`: 16 document openings in one batch, 128 tokens each,
temperature 0 and 1, the tiny-zh-doc-small and n-gram drafts at gamma 2, 4 and 6, one torch thread. For each row it
serves the batch without speculation and then with it, `--repeats` times in turn, so a load change from other jobs on
the shared CPU hits both sides of a pair. Per row this script reports the median over repeats of the paired ratio
(tokens/s with speculation / tokens/s without, in the same repeat) with a percentile bootstrap 95% interval over
repeats (scripts/ch07b_speed_ab.py's `bootstrap_median`: 2000 resamples, seed 0), and the median tokens/s of each side.
CPU figures: they depend on the machine and its load; acceptance, tokens per target forward and engine steps depend
only on the seeds.

Taught in: chapters/07b-speculative-decoding.ipynb
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
from speculative import ENGINE_GAMMAS, ENGINE_TEMPERATURES, forward_ms, measure_engine, prompts  # noqa: E402

from decodelab.decoding.speculative import NgramDraft  # noqa: E402
from decodelab.models import load_model  # noqa: E402

OUT = ROOT / "chapters" / "data" / "07b-speculative-engine.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="interleaved A/B repeats per row (default 10)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each request (default 128)")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2, got {args.repeats}")
    if args.tokens < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens}")
    torch.set_num_threads(1)
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    small = load_model("tiny-zh-doc-small", device="cpu")[0]
    texts = prompts(16)
    cost_ratio = forward_ms(small) / forward_ms(target)
    start = time.perf_counter()
    rows = measure_engine(target, tokenizer, {"tiny-zh-doc-small": small, "n-gram (max n 3)": NgramDraft()},
                          ENGINE_GAMMAS, texts, args.tokens, ENGINE_TEMPERATURES, args.repeats)
    print(f"CPU, 1 thread, {args.repeats} interleaved repeats; c = {cost_ratio:.2f}")
    print("| T | draft | gamma | median paired speed-up [95% CI] | plain tok/s min-max |")
    print("|---:|---|---:|---:|---:|")
    for row in rows:
        plain = [row["plain_tokens"] / s for s in row.pop("plain_seconds")]
        spec = [row["tokens"] / s for s in row.pop("spec_seconds")]
        ratios = [s / p for s, p in zip(spec, plain)]
        low, high = bootstrap_median(ratios)
        del row["speedup"], row["spec_tokens_per_s"], row["plain_tokens_per_s"]  # fastest-of figures: replaced
        row.update({"median_ratio": statistics.median(ratios), "ci_low": low, "ci_high": high, "ratios": ratios,
                    "plain_tokens_per_s": plain, "spec_tokens_per_s": spec})
        print(f"| {row['temperature']:g} | {row['draft']} | {row['gamma']} | {row['median_ratio']:.2f}x "
              f"[{low:.2f}, {high:.2f}] | {min(plain):.0f}-{max(plain):.0f} |")
    write(OUT, {
        "target": "tiny-zh-doc (shipped)", "mode": "engine", "device": "cpu", "threads": 1, "repeats": args.repeats,
        "note": "CPU figures on a CPU shared with other jobs: each repeat serves the batch without and then with "
                "speculation on the same prompts and seeds; ratio = tokens/s with / tokens/s without, of the same "
                "repeat; interval = percentile bootstrap over repeats (2000 resamples, seed 0); acceptance, alpha, "
                "tokens per target forward and steps depend only on the seeds",
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "prompts": texts,
        "max_tokens": args.tokens, "temperatures": list(ENGINE_TEMPERATURES), "draft_cost_ratio": cost_ratio,
        "seconds": time.perf_counter() - start, "rows": rows,
    }, "python scripts/ch07b_engine_ab.py")


if __name__ == "__main__":
    main()
