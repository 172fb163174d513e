"""Best-of-n benchmark: accuracy against n for three verifiers and pass@k, at three temperatures, with the token cost.

Model: the shipped tiny-zh-doc through `decodelab.engine.engine.Engine` (block size 4: a prompt of 12-15 tokens, BOS, 10
characters and a name of 2-5, has three whole blocks that its samples share). Task (`decodelab.toy.questions`): the
prompt "这是{P}在{CITY}的一天。" for every one of the 20 people with the first 10 cities (200 questions; `--quick`: 20,
one city); a sample is right when the first person it names in its first 40 tokens is P. 16 samples per question,
question i seeded i, at T = 0.7, 1, 1.5.

It reports, for n = 1, 2, 4, 8, 16 (the first n of the 16 samples):

  - best-of-n accuracy under the verifiers "exact" (any of the n is right: the oracle), "likelihood" (highest mean
    log-probability per token) and "majority" (self-consistency), with Wilson 95% intervals over questions;
  - pass@k for k = n, the unbiased estimator from all 16 samples, averaged over questions, bootstrap 95% interval;
  - tokens generated per question (n x the mean sample length);
  - the truth's own single-sample accuracy (documents drawn from the toy language, read the same way);
  - KV blocks the prompt sharing saved, summed over the engine's steps, and the engine's prefill / decode tokens;
  - the paired difference n = 16 minus n = 4 for each verifier (the same questions, so a percentile bootstrap over
    questions of the per-question difference), read against an equivalence margin of +-0.03 (3 points) fixed
    before the run: "no gain" only when the whole 95% interval lies inside the margin;
  - a greedy baseline (temperature 0, one answer per question, the same questions), with its Wilson interval.

Accuracy figures depend only on the seeds (up to float rounding), not on the machine; the seconds are a CPU figure
at `--threads` threads.

    python benchmarks/best_of_n.py [--quick] [--threads N] [--out PATH]

Prints markdown tables and writes benchmarks/results/best_of_n.json. Taught in: chapters/07e-best-of-n.ipynb
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from decodelab.measure.best_of_n import VERIFIERS, bootstrap_mean, draw, is_right, mean_pass_at_k
from decodelab.toy.questions import questions, truth_accuracy
from decodelab.measure.constrained import wilson_interval
from decodelab.engine import Engine
from decodelab.models import load_model

RESULTS = Path(__file__).parent / "results" / "best_of_n.json"
NS = (1, 2, 4, 8, 16)
MARGIN = 0.03          # equivalence margin for "n = 16 gains nothing over n = 4", fixed before the run
TEMPERATURES = (0.7, 1.0, 1.5)
MAX_TOKENS = 40
BLOCK_SIZE = 4


def measure(engine: Engine, asked, temperature: float) -> dict:
    """Every figure of one temperature."""
    start = time.perf_counter()
    result = draw(engine, asked, max(NS), temperature, seed=0, max_tokens=MAX_TOKENS)
    seconds = time.perf_counter() - start
    rows = []
    for n in NS:
        row = {"n": n, "tokens_per_question": float(np.mean([sum(s.num_tokens[:n]) for s in result.samples]))}
        for verifier in VERIFIERS:
            right = sum(is_right(s, n, verifier) for s in result.samples)
            row[verifier] = asdict(wilson_interval(right, len(result.samples)))
        value, low, high = bootstrap_mean(mean_pass_at_k(result.samples, n))
        row["pass_at_k"] = {"value": value, "low": low, "high": high}
        rows.append(row)
    paired = {}
    for verifier in VERIFIERS:                          # per question: right at n = 16 minus right at n = 4
        diffs = [float(is_right(s, 16, verifier)) - float(is_right(s, 4, verifier)) for s in result.samples]
        value, low, high = bootstrap_mean(diffs)
        paired[verifier] = {"value": value, "low": low, "high": high,
                            "verdict": ("no gain (inside the margin)" if -MARGIN < low and high < MARGIN
                                        else "a gain" if low > 0 else "a loss" if high < 0 else "inconclusive")}
    per_person: dict[str, list[int]] = {}
    for s in result.samples:
        per_person.setdefault(s.question.answer, []).append(sum(s.correct))
    return {"temperature": temperature, "seconds": seconds, "rows": rows, "paired_16_minus_4": paired,
            "sharing": {**asdict(result.sharing), "saved_share": result.sharing.saved_share},
            "prefill_tokens": result.prefill_tokens, "cached_prompt_tokens": result.cached_prompt_tokens,
            "decode_tokens": result.decode_tokens,
            "right_per_person": {p: float(np.mean(c)) / max(NS) for p, c in per_person.items()},
            "examples": [{"prompt": s.question.prompt, "texts": list(s.texts[:4]), "answers": list(s.answers[:4]),
                          "mean_logprobs": list(s.mean_logprobs[:4])} for s in result.samples[:3]]}


def fmt(row: dict) -> str:
    return f"{row['value']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 questions instead of 200")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, help="where the JSON goes (default results/best_of_n.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("tiny-zh-doc", device="cpu")
    asked = questions(1 if args.quick else 10)
    engine = Engine(model, tokenizer, block_size=BLOCK_SIZE, max_num_seqs=128)
    by_temperature = [measure(engine, asked, t) for t in TEMPERATURES]
    greedy_draw = draw(engine, asked, 1, 0.0, seed=0, max_tokens=MAX_TOKENS)     # temperature 0: the argmax path
    greedy = asdict(wilson_interval(sum(is_right(s, 1, "exact") for s in greedy_draw.samples), len(asked)))
    truth_right, truth_total = truth_accuracy(200 if args.quick else 2000, MAX_TOKENS, seed=0)
    truth = asdict(wilson_interval(truth_right, truth_total))

    print(f"tiny-zh-doc, {len(asked)} questions x {max(NS)} samples, CPU, {args.threads} thread(s); "
          "95% intervals in brackets")
    print(f"truth (the toy language's own documents), one sample: {fmt(truth)}")
    print(f"greedy (temperature 0), one answer: {fmt(greedy)}")
    for block in by_temperature:
        print(f"\nT = {block['temperature']:g} ({block['seconds']:.1f} s; sharing saved "
              f"{block['sharing']['saved_share']:.1%} of block-steps)")
        print("| n | exact (oracle) | likelihood | majority | pass@n (unbiased) | tokens / question |")
        print("|---:|---|---|---|---|---:|")
        for row in block["rows"]:
            print(f"| {row['n']} | {fmt(row['exact'])} | {fmt(row['likelihood'])} | {fmt(row['majority'])} | "
                  f"{fmt(row['pass_at_k'])} | {row['tokens_per_question']:.0f} |")
        print("n = 16 minus n = 4, paired over questions (margin +-%.2f): " % MARGIN
              + "; ".join(f"{v} {fmt(d)} {d['verdict']}" for v, d in block["paired_16_minus_4"].items()))
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": "tiny-zh-doc (shipped)", "device": "cpu", "threads": args.threads, "quick": args.quick,
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "questions": len(asked), "samples": max(NS), "ns": list(NS), "max_tokens": MAX_TOKENS,
        "block_size": BLOCK_SIZE, "truth": truth, "truth_documents": truth_total, "greedy": greedy,
        "equivalence_margin": MARGIN, "temperatures": by_temperature,
    }, ensure_ascii=False, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
