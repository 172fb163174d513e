"""Chapter 07b's CPU speed-ups from repeated, interleaved A/B runs: plain `generate`, then `speculative_generate`,
on the same prompts and seeds (6 document openings, 128 tokens), repeated 15 times, written to
chapters/data/07b-speed-ab.json (4.6 minutes on the 2-core course machine while other jobs shared it).

    .venv/bin/python scripts/ch07b_speed_ab.py [--repeats 15] [--prompts 6] [--tokens 128]

Settings: the tiny-zh-doc-small draft at gamma 2, 4 and 8 and the n-gram draft (max n 3) at gamma 4, target
tiny-zh-doc, temperature 1, one torch thread. One repeat runs every setting once, in turn, and each setting's run is
benchmarks/speculative.py's `measure` (plain then speculative on each prompt, the two alternating prompt by prompt),
so a load change from other jobs on the shared CPU hits both sides of a pair. Per setting it reports the median over
repeats of the paired ratio (plain ms/token / speculative ms/token of the same repeat) with a bootstrap 95% interval
over repeats (percentile, 2000 resamples, seed 0), and the spread of plain ms/token. CPU figures: they depend on the
machine and its load; the acceptance figures in 07b-speculative.json depend only on the seeds.

Taught in: chapters/07b-speculative-decoding.ipynb
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from provenance import stamp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from speculative import forward_ms, measure, prompts  # noqa: E402  (benchmarks/speculative.py)

from decodelab.decoding.speculative import ModelDraft, NgramDraft  # noqa: E402
from decodelab.models import load_model  # noqa: E402

OUT = ROOT / "chapters" / "data" / "07b-speed-ab.json"
SETTINGS = (("tiny-zh-doc-small", 2), ("tiny-zh-doc-small", 4), ("tiny-zh-doc-small", 8), ("n-gram (max n 3)", 4))


def bootstrap_median(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the median of `values` (resampling the repeats)."""
    if len(values) < 2:
        raise ValueError(f"values must hold at least 2 repeats, got {len(values)}")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved A/B repeats per setting (default 15)")
    parser.add_argument("--prompts", type=int, default=6, help="document openings per run (default 6)")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each run (default 128)")
    args = parser.parse_args()
    for name in ("repeats", "prompts", "tokens"):
        if getattr(args, name) < (2 if name == "repeats" else 1):
            parser.error(f"--{name} must be at least {2 if name == 'repeats' else 1}, got {getattr(args, name)}")
    torch.set_num_threads(1)
    target, tokenizer = load_model("tiny-zh-doc", device="cpu")
    small = load_model("tiny-zh-doc-small", device="cpu")[0]
    drafts = {"tiny-zh-doc-small": ModelDraft(small), "n-gram (max n 3)": NgramDraft()}
    texts = prompts(args.prompts)
    cost_ratio = forward_ms(small) / forward_ms(target)
    runs = {setting: [] for setting in SETTINGS}
    start = time.perf_counter()
    for repeat in range(args.repeats):
        for name, gamma in SETTINGS:
            row = measure(target, tokenizer, {name: drafts[name]}, (gamma,), texts, args.tokens)[0]
            runs[(name, gamma)].append(row)
        print(f"repeat {repeat + 1}/{args.repeats}: {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    print(f"CPU, 1 thread, {args.repeats} interleaved repeats; c = {cost_ratio:.2f}")
    print("| draft | gamma | median paired speed-up [95% CI] | plain ms/tok min-max | spec ms/tok median |")
    print("|---|---:|---:|---:|---:|")
    for (name, gamma), reps in runs.items():
        ratios = [r["plain_ms_per_token"] / r["spec_ms_per_token"] for r in reps]
        low, high = bootstrap_median(ratios)
        plain = [r["plain_ms_per_token"] for r in reps]
        spec = [r["spec_ms_per_token"] for r in reps]
        rows.append({
            "draft": name, "gamma": gamma, "median_ratio": statistics.median(ratios), "ci_low": low, "ci_high": high,
            "ratios": ratios, "plain_ms_per_token": plain, "spec_ms_per_token": spec,
            "tokens_per_target_forward": reps[0]["tokens_per_target_forward"],
            "acceptance_rate": reps[0]["acceptance_rate"],
        })
        print(f"| {name} | {gamma} | {rows[-1]['median_ratio']:.2f}x [{low:.2f}, {high:.2f}] | "
              f"{min(plain):.2f}-{max(plain):.2f} | {statistics.median(spec):.2f} |")
    OUT.write_text(json.dumps(stamp({
        "target": "tiny-zh-doc (shipped)", "device": "cpu", "threads": 1, "repeats": args.repeats,
        "note": "CPU figures on a CPU shared with other jobs: each repeat times plain generate and speculative "
                "generation alternately on the same prompts and seeds; ratio = plain ms/token / speculative "
                "ms/token of the same repeat; interval = percentile bootstrap over repeats (2000 resamples, seed 0)",
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "prompts": texts, "max_tokens": args.tokens, "temperature": 1.0, "draft_cost_ratio": cost_ratio,
        "seconds": time.perf_counter() - start, "rows": rows,
    }, "python scripts/ch07b_speed_ab.py"), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
